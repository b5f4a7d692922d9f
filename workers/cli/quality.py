"""``tideplane registry golden set MODEL FILE`` and ``golden show MODEL``: a model's golden set
(workflows/quality/golden_set.py), versioned in the registry beside its weights; the rollout runs
the current revision at warm-up."""

from __future__ import annotations

from workers.cli.errors import FAILED, report
import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from activities.quality.golden_sets import golden_history, set_golden_set
from activities.registry.store import Registry
from workers.cli.registry import answering_registry_errors, open_registry
from workers.config import Settings
from workflows.core.failures import field_errors
from workflows.quality.golden_set import GoldenSet


def load_golden(path: str) -> GoldenSet:
    """A golden set from YAML or JSON; SystemExit naming the file and the field when it is wrong."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise SystemExit(f"tideplane: error: golden set {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SystemExit(f"tideplane: error: golden set {path} is not YAML: {exc}") from None
    try:
        return GoldenSet.model_validate(raw)
    except ValidationError as exc:
        raise SystemExit(f"tideplane: error: golden set {path}: {field_errors(exc, '(file)')}") from None


def store_golden(registry: Registry, model: str, path: str) -> str:
    """Store the golden set in ``path`` as the model's next revision; the line saying what happened."""
    golden = load_golden(path)
    revision, changed = set_golden_set(registry, model, golden)
    must = sum(c.must_pass for c in golden.cases)
    return (
        f"golden set of {model} {'set' if changed else 'unchanged'}: revision {revision.revision}, "
        f"{len(golden.cases)} cases ({must} must pass), minimum pass rate {golden.min_pass_rate:.0%}, "
        f"margin vs stable {golden.margin:.0%}"
    )


def cmd_golden_set(args, settings: Settings) -> int:
    print(store_golden(open_registry(settings), args.model, args.file))
    return 0


def cmd_golden_show(args, settings: Settings) -> int:
    history = golden_history(open_registry(settings), args.model)
    if history is None or history.current is None:
        report(f"{args.model} has no golden set (tideplane registry golden set {args.model} FILE)", FAILED)
        return 1
    wanted = history.current if args.revision is None else next((r for r in history.revisions if r.revision == args.revision), None)
    if wanted is None:
        report(f"{args.model} has no golden set revision {args.revision} (1..{history.current.revision})", FAILED)
        return 1
    if args.json:
        print(json.dumps(wanted.golden.model_dump(mode="json", exclude_defaults=True), indent=1))
        return 0
    print(f"golden set of {args.model}: revision {wanted.revision} of {history.current.revision}, set {wanted.set_at:%Y-%m-%d %H:%M}")
    print(yaml.safe_dump(wanted.golden.model_dump(mode="json", exclude_defaults=True), sort_keys=False).rstrip())
    return 0


def add_golden_commands(sub) -> None:
    """``golden set`` / ``golden show`` under ``tideplane registry`` (``sub``: the registry's subparsers)."""
    golden = sub.add_parser("golden", help="a model's golden set: prompts with checks the rollout runs at warm-up")
    commands = golden.add_subparsers(dest="golden_command", required=True)
    p = commands.add_parser("set", help="store FILE (YAML or JSON) as MODEL's next golden set revision")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=answering_registry_errors(cmd_golden_set))
    p = commands.add_parser("show", help="MODEL's current golden set (or --revision N)")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--revision", type=int)
    p.add_argument("--json", action="store_true", help="print the set as JSON")
    p.set_defaults(func=answering_registry_errors(cmd_golden_show))
