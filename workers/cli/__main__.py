"""``python -m workers.cli``: the ``tideplane`` command (the sandbox starts the worker so)."""

import sys

from workers.cli.main import main

sys.exit(main())
