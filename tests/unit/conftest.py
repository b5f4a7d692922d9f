"""Unit-tier fixtures: moto, for the staging bench's S3 (tests/unit/bench/test_bench.py)."""

from tests.servers import moto_url  # noqa: F401
