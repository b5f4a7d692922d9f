"""The README and docs/ name only what exists, and the reference names all of it.

Every repository path, Python module, `tideplane` command and flag, `make` target, TIDEPLANE_*
setting and `temporal` command line that README.md or docs/*.md shows is checked against the code:
a path resolves, a module and its attribute are defined, a command and its flags are in the CLI's
argparse parser (or the temporal CLI's help), a workflow type, signal, query or update is
registered on the worker, and a copy-pasteable `--input` in a code block validates against that
workflow's input model. docs/reference.md must list every workflow, signal, query, update, CLI
command and flag and setting. Nothing here starts a server.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import pkgutil
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, TypeAdapter
from temporalio.workflow import _Definition

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOC_FILES = [README, *sorted((REPO / "docs").glob("*.md"))]
REFERENCE = REPO / "docs" / "reference.md"
CAPABILITIES = ("rollout", "quality", "node_cache", "scaling", "spot", "registry", "cost", "quotas", "adapters", "classes")
TOP_DIRS = ("workflows", "activities", "workers", "infra", "tests", "benchmarks", "docs")
PRODUCT_CODE = ("workflows", "activities", "workers", "infra", "benchmarks")
SHELL_SEPARATORS = {"|", "||", "&&", ";", ">", ">>", "2>&1"}


# ---- reading the docs ---------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)


def _read(doc: Path) -> str:
    return doc.read_text()


def fenced_blocks(text: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(text)]


def inline_spans(text: str) -> list[str]:
    """Inline code outside fenced blocks, joined across line breaks; `\\|` (a pipe in a table) unescaped."""
    rest = FENCE.sub("", text)
    return [re.sub(r"\s*\n\s*", " ", m.group(1)).replace("\\|", "|") for m in re.finditer(r"`([^`]+)`", rest)]


def all_code(doc: Path) -> list[tuple[str, bool]]:
    """(code, fenced) for every fenced block and inline span of a doc."""
    text = _read(doc)
    return [(block, True) for block in fenced_blocks(text)] + [(span, False) for span in inline_spans(text)]


def shell_commands(code: str, fenced: bool) -> list[list[str]]:
    """The shell commands in a code block (continuation lines and multi-line quotes joined, comments
    dropped) or an inline span, as token lists split at pipes, `;` and `&&` (not inside `[...]`)."""
    lines = code.split("\n") if fenced else [code]
    commands: list[list[str]] = []
    i = 0
    while i < len(lines):
        line, i = lines[i], i + 1
        while True:
            while line.rstrip().endswith("\\") and i < len(lines):
                line, i = line.rstrip()[:-1] + " " + lines[i], i + 1
            try:
                tokens = shlex.split(line, comments=True)
                break
            except ValueError:  # an open quote: the command goes on on the next line
                if i >= len(lines):
                    tokens = line.split()
                    break
                line, i = line + "\n" + lines[i], i + 1
        commands += _split_at_separators(tokens)
    return commands


def _split_at_separators(tokens: list[str]) -> list[list[str]]:
    out, current, depth = [], [], 0
    for token in tokens:
        depth += token.count("[") - token.count("]")
        if token in SHELL_SEPARATORS and depth <= 0:
            out.append(current)
            current = []
        else:
            current.append(token)
    return [*out, current]


def commands_of(program: str) -> list[tuple[Path, list[str], bool]]:
    """(doc, the arguments after `program`, fenced) for every command line running ``program``."""
    found = []
    for doc in DOC_FILES:
        for code, fenced in all_code(doc):
            if program not in code:
                continue
            for tokens in shell_commands(code, fenced):
                index = 0
                while index < len(tokens) and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[index]):
                    index += 1  # VAR=value before the command
                if index < len(tokens) and (tokens[index] == program or tokens[index].endswith(f"/{program}")):
                    found.append((doc, tokens[index + 1 :], fenced))
    return found


def _flags(args: list[str]) -> list[str]:
    """The options a command line passes: `--name`, `-o` (brackets of usage lines and `=value` removed)."""
    out = []
    for arg in args:
        arg = arg.strip("[]()")
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", arg):
            out.append(arg.split("=", 1)[0])
    return out


# ---- the code's side ----------------------------------------------------------------------------


@functools.cache
def tideplane_parser() -> argparse.ArgumentParser:
    """The parser `tideplane`'s main builds: a function of workers.cli (a module or a package) that
    takes no argument and returns the parser with the `sandbox` command."""
    package = importlib.import_module("workers.cli")
    modules = [package]
    if hasattr(package, "__path__"):
        modules += [importlib.import_module(f"workers.cli.{m.name}") for m in pkgutil.iter_modules(package.__path__) if m.name != "__main__"]
    for module in modules:
        for name, function in vars(module).items():
            if "parser" not in name or not inspect.isfunction(function) or function.__module__ != module.__name__:
                continue
            if any(p.default is inspect.Parameter.empty for p in inspect.signature(function).parameters.values()):
                continue
            parser = function()
            if isinstance(parser, argparse.ArgumentParser) and "sandbox" in _subcommands(parser):
                return parser
    raise AssertionError("no parser factory in workers.cli")


@functools.cache
def bench_parser() -> argparse.ArgumentParser:
    """`tideplane bench` is parsed by benchmarks.cli (loaded only when run): its commands, under `bench`."""
    from benchmarks.cli import add_bench_commands

    parser = argparse.ArgumentParser(prog="tideplane")
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _children(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> dict[str, argparse.ArgumentParser]:
    """A command's subcommands; `bench`'s are benchmarks.cli's (the main parser passes them through)."""
    if path == ("bench",) and not _subcommands(parser):
        return _subcommands(_subcommands(bench_parser())["bench"])
    return _subcommands(parser)


def resolve_tideplane(args: list[str]) -> tuple[tuple[str, ...], argparse.ArgumentParser, str | None]:
    """(the command path, its parser, an error) for the arguments of a `tideplane` command line."""
    parser, path = tideplane_parser(), ()
    for arg in args:
        subs = _children(parser, path)
        if not subs or arg.startswith("-"):
            break
        if arg not in subs:
            return path, parser, f"`tideplane {' '.join([*path, arg])}`: no such command (has {sorted(subs)})"
        parser, path = subs[arg], (*path, arg)
    return path, parser, None


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = _children(parser, path)
    if not subs:
        return [(path, parser)]
    return [leaf for name, sub in subs.items() for leaf in leaf_commands(sub, (*path, name))]


@functools.cache
def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


@functools.cache
def workflow_definitions() -> dict[str, _Definition]:
    """Every workflow the worker registers, by type name."""
    from workers.worker import WORKFLOWS

    return {d.name: d for d in (_Definition.from_class(cls) for cls in WORKFLOWS)}


@functools.cache
def settings_names() -> tuple[str, ...]:
    """Every environment variable the Settings read (first the TIDEPLANE_ name of each)."""
    from workers.config import Settings

    names = []
    for field in Settings.model_fields.values():
        names += [str(choice) for choice in field.validation_alias.choices]
    return tuple(names)


@functools.cache
def code_text() -> dict[Path, str]:
    files = {}
    for top in PRODUCT_CODE:
        for path in (REPO / top).rglob("*"):
            if path.suffix in (".py", ".yaml", ".yml", ".sh", ".env", ".tmpl") and path.is_file():
                files[path] = path.read_text(errors="replace")
    return files


@functools.cache
def tideplane_variables() -> set[str]:
    """TIDEPLANE_* names the product reads: the Settings', literals in the code, and env_prefix + field."""
    names = {n for n in settings_names() if n.startswith("TIDEPLANE_")}
    for path, text in code_text().items():
        names |= set(re.findall(r"TIDEPLANE_[A-Z0-9_]*[A-Z0-9]", text))
        for prefix in re.findall(r"env_prefix=\"(TIDEPLANE_[A-Z0-9_]+)\"", text):
            names |= {prefix + field.upper() for field in re.findall(r"^    ([a-z][a-z0-9_]*):", text, re.M)}
    return names


# ---- the checks ---------------------------------------------------------------------------------


def test_the_readme_is_a_front_door_with_the_two_commands():
    text = _read(README)
    assert len(text.splitlines()) < 200
    assert any({"make demo", "make test"} <= {line.strip() for line in block.splitlines()} for block in fenced_blocks(text))


def test_every_capability_has_its_task_doc_and_the_readme_links_every_doc():
    assert [cap for cap in CAPABILITIES if not (REPO / "docs" / f"{cap}.md").is_file()] == []
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", _read(README)))
    assert {f"docs/{doc.name}" for doc in DOC_FILES[1:]} - linked == set()


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*_\[\]]|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", FENCE.sub("", _read(doc)), re.M)}


def test_every_link_resolves_with_its_anchor():
    broken = []
    for doc in DOC_FILES:
        prose = re.sub(r"`[^`]+`", "", FENCE.sub("", _read(doc)))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert broken == []


PATH = re.compile(
    r"(?<![\w./$~-])((?:" + "|".join(TOP_DIRS) + r")/[\w./{},*-]*|Makefile|pyproject\.toml)(?:::(\w+))?"
)


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]+)\}", pattern)
    if not match:
        return [pattern]
    return [p for alt in match.group(1).split(",") for p in _expand(pattern[: match.start()] + alt + pattern[match.end() :])]


def test_every_repository_path_exists():
    missing = []
    for doc in DOC_FILES:
        for code, _ in all_code(doc):
            for match in PATH.finditer(code):
                if code[: match.start()].rstrip().endswith(">"):  # a file the command writes
                    continue
                name, test = match.group(1).rstrip(".,:;"), match.group(2)
                for path in _expand(name):
                    hits = list(REPO.glob(path.rstrip("/"))) if "*" in path else [REPO / path.rstrip("/")]
                    if not hits or not all(h.exists() for h in hits):
                        missing.append(f"{doc.name}: {path}")
                    elif test and not re.search(rf"^(async )?def {test}\b", hits[0].read_text(), re.M):
                        missing.append(f"{doc.name}: {path}::{test}")
    assert missing == []


FILE_SUFFIXES = {"py", "md", "json", "yaml", "yml", "sh", "txt", "csv", "png", "toml"}
MODULE = re.compile(r"(?<![\w./-])((?:" + "|".join(PRODUCT_CODE + ("tests",)) + r")(?:\.[A-Za-z_]\w*)+)")


def _defines(source: str, name: str) -> bool:
    return bool(
        re.search(rf"^(async def|def|class) {name}\b|^{name}\s*[:=]|^\s*from \S+ import .*\b{name}\b|^\s+{name},?$", source, re.M)
    )


def test_every_python_module_and_name_exists():
    """`workflows.naming`, `workers.worker.WORKFLOWS`, `infra.grafana.import_help(...)`: the module
    is a file or package, and the first name after it is defined there."""
    missing = []
    for doc in DOC_FILES:
        for code, _ in all_code(doc):
            for dotted in MODULE.findall(code):
                parts = dotted.split(".")
                if parts[-1] in FILE_SUFFIXES:  # a file name (activities.py), not a module
                    continue
                for cut in range(len(parts), 0, -1):
                    base = REPO.joinpath(*parts[:cut])
                    source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
                    if source.is_file() or base.is_dir():
                        rest = parts[cut:]
                        if rest and not (source.is_file() and _defines(source.read_text(), rest[0])):
                            if base.with_suffix(".py").is_file() or not (base / rest[0]).exists():
                                missing.append(f"{doc.name}: {dotted}")
                        break
                else:
                    missing.append(f"{doc.name}: {dotted}")
    assert missing == []


def test_every_tideplane_command_and_flag_exists():
    wrong = []
    for doc, args, _ in commands_of("tideplane"):
        path, parser, error = resolve_tideplane(args)
        if error:
            wrong.append(f"{doc.name}: {error}")
            continue
        known = _options(parser) | {"--help", "-h"}
        wrong += [f"{doc.name}: `tideplane {' '.join(path)} {flag}`: no such flag" for flag in _flags(args) if flag not in known]
    assert wrong == []


def test_every_make_target_exists():
    wrong = [f"{doc.name}: make {args[0]}" for doc, args, _ in commands_of("make") if args and args[0] not in make_targets()]
    assert wrong == []


def test_every_tideplane_setting_exists():
    known = tideplane_variables()
    wrong = []
    for doc in DOC_FILES:
        for name in set(re.findall(r"TIDEPLANE_[A-Z0-9_]+", _read(doc))):
            if name.endswith("_"):  # a pattern such as TIDEPLANE_SANDBOX_<COMPONENT>_PORT
                if not any(k.startswith(name) for k in known):
                    wrong.append(f"{doc.name}: {name}<...>")
            elif name not in known:
                wrong.append(f"{doc.name}: {name}")
    assert sorted(wrong) == []


# ---- temporal command lines ---------------------------------------------------------------------

TEMPORAL = Path(sys.executable).parent / "temporal"


@functools.cache
def temporal_help(path: tuple[str, ...]) -> tuple[str, set[str]]:
    """(the command the temporal CLI resolves `path` to, its flags with the global ones)."""
    run = subprocess.run([str(TEMPORAL), *path, "--help"], capture_output=True, text=True, timeout=30)
    usage = re.search(r"^Usage:\n\s+temporal(.*?)(?: \[flags\]| \[command\])?$", run.stdout, re.M)
    flags_text = run.stdout.split("\nFlags:\n", 1)[-1]
    flags = set(re.findall(r"^\s+(?:(-\w), )?(--[\w-]+)", flags_text, re.M))
    names = {f for pair in flags for f in pair if f} | set(re.findall(r'Aliased as "(--[\w-]+)"', flags_text))
    return (usage.group(1).strip() if usage else ""), names


@functools.cache
def temporal_global_flags() -> set[str]:
    run = subprocess.run([str(TEMPORAL), "options"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"(--[\w-]+|(?<![\w-])-\w)(?=[ ,])", run.stdout))


def _value(args: list[str], *names: str) -> str | None:
    for index, arg in enumerate(args):
        if arg in names and index + 1 < len(args):
            return args[index + 1]
        for name in names:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _command_path(args: list[str]) -> tuple[str, ...]:
    path = []
    for arg in args:
        if arg.startswith("-"):
            break
        path.append(arg)
    return tuple(path)


def test_every_temporal_command_and_flag_exists():
    wrong = []
    for doc, args, _ in commands_of("temporal"):
        path = _command_path(args)
        if not path:
            continue
        resolved, flags = temporal_help(path)
        if resolved != " ".join(path):
            wrong.append(f"{doc.name}: `temporal {' '.join(path)}`: no such command")
            continue
        known = flags | temporal_global_flags() | {"--help", "-h"}
        wrong += [f"{doc.name}: `temporal {' '.join(path)} {flag}`: no such flag" for flag in _flags(args) if flag not in known]
    assert wrong == []


def _ids_to_types() -> dict[str, str]:
    """Workflow IDs (and their first segment) of the docs' `temporal workflow start` lines -> type."""
    ids = {}
    for _, args, _ in commands_of("temporal"):
        if _command_path(args) == ("workflow", "start"):
            wid, kind = _value(args, "--workflow-id", "-w"), _value(args, "--type", "--name")
            if wid and kind:
                ids[wid] = kind
                ids.setdefault(wid.split("/", 1)[0], kind)
    return ids


def _handler_kind(path: tuple[str, ...]) -> str | None:
    return {("workflow", "signal"): "signals", ("workflow", "query"): "queries", ("workflow", "update", "execute"): "updates",
            ("workflow", "update", "start"): "updates"}.get(path)


def test_every_workflow_type_signal_query_and_update_named_exists():
    definitions = workflow_definitions()
    ids = _ids_to_types()
    wrong = []
    for doc, args, _ in commands_of("temporal"):
        path = _command_path(args)
        for query in filter(None, [_value(args, "--query", "-q")]):
            wrong += [f"{doc.name}: WorkflowType {t}" for t in re.findall(r'WorkflowType\s*=\s*"(\w+)"', query) if t not in definitions]
        if path == ("workflow", "start"):
            kind, queue = _value(args, "--type", "--name"), _value(args, "--task-queue", "-t")
            if kind is not None and kind not in definitions:
                wrong.append(f"{doc.name}: workflow type {kind!r}")
            if queue is not None and queue != "tideplane":
                wrong.append(f"{doc.name}: {kind} started on task queue {queue!r}")
        elif (handlers := _handler_kind(path)) is not None:
            name, wid = _value(args, "--name", "--type"), _value(args, "--workflow-id", "-w") or ""
            kind = ids.get(wid) or ids.get(wid.split("/", 1)[0])
            candidates = [definitions[kind]] if kind in definitions else list(definitions.values())
            if not any(name in getattr(d, handlers) for d in candidates):
                wrong.append(f"{doc.name}: {handlers[:-1] if handlers != 'queries' else 'query'} {name!r} of {kind or wid}")
    assert wrong == []


def _input_type(definition: _Definition, handlers: str | None, name: str | None) -> type | None:
    """The model a workflow's run, signal or update input is validated into (None: not a model)."""
    if handlers is None:
        fn = definition.run_fn
    else:
        fn = getattr(definition, handlers)[name].fn
    hints = typing.get_type_hints(fn)
    args = [v for k, v in hints.items() if k != "return"]
    if not args:
        return None
    kind = args[0]
    if typing.get_origin(kind) is not dict and not (typing.get_args(kind) and typing.get_origin(typing.get_args(kind)[0]) is dict):
        return kind
    # a plain-JSON update validated inside the workflow: into <Name>Input, or merged into its result's model
    module = sys.modules[definition.cls.__module__]
    named = getattr(module, "".join(p.title() for p in name.split("_")) + "Input", None)
    if isinstance(named, type) and issubclass(named, BaseModel):
        return named
    result = hints.get("return")
    return result if isinstance(result, type) and issubclass(result, BaseModel) else None


def _unknown_fields(kind: object, value: object, where: str = "") -> list[str]:
    """Fields of ``value`` its model does not have, also where the model ignores them (a misspelt
    field in a doc would be dropped silently there)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if isinstance(kind, type) and issubclass(kind, BaseModel) and isinstance(value, dict):
        fields = kind.model_fields
        out = [f"{where}{k}" for k in value if k not in fields]
        return out + [u for k, v in value.items() if k in fields for u in _unknown_fields(fields[k].annotation, v, f"{where}{k}.")]
    if origin is list and isinstance(value, list):
        return [u for i, v in enumerate(value) for u in _unknown_fields(args[0], v, f"{where}{i}.")]
    if origin is dict and isinstance(value, dict):
        return [u for k, v in value.items() for u in _unknown_fields(args[1], v, f"{where}{k}.")]
    if args:  # a union, Optional or Annotated: the first member that knows every field
        results = [_unknown_fields(a, value, where) for a in args]
        return min(results, key=len)
    return []


def test_every_input_in_a_code_block_is_valid():
    """A copy-pasted `--input` of a docs code block is accepted by the workflow (bad-input examples
    live in inline code, outside code blocks)."""
    definitions = workflow_definitions()
    ids = _ids_to_types()
    wrong = []
    for doc, args, fenced in commands_of("temporal"):
        path, raw = _command_path(args), _value(args, "--input", "-i")
        if not fenced or raw is None:
            continue
        if path == ("workflow", "start"):
            kind, handlers, name = _value(args, "--type", "--name"), None, None
        elif (handlers := _handler_kind(path)) is not None:
            name, wid = _value(args, "--name", "--type"), _value(args, "--workflow-id", "-w") or ""
            kind = ids.get(wid) or ids.get(wid.split("/", 1)[0])
        else:
            continue
        if kind not in definitions:
            continue
        model = _input_type(definitions[kind], handlers, name)
        if model is None:
            continue
        try:
            value = json.loads(raw)
            if handlers == "updates" and isinstance(model, type) and issubclass(model, BaseModel) and not model.__name__.endswith("Input"):
                value = {**model().model_dump(), **value}
            TypeAdapter(model).validate_python(value)
            if unknown := _unknown_fields(model, value):
                raise ValueError(f"unknown fields {unknown}")
        except (ValueError, TypeError) as exc:
            wrong.append(f"{doc.name}: {kind} {name or 'start'} --input {raw}: {str(exc).splitlines()[0:3]}")
    assert wrong == []


# ---- the reference is complete ------------------------------------------------------------------


def _reference_code() -> set[str]:
    return set(inline_spans(_read(REFERENCE)))


def test_the_reference_lists_every_workflow_signal_query_and_update():
    spans, text = _reference_code(), _read(REFERENCE)
    missing = []
    for name, definition in workflow_definitions().items():
        section = re.search(rf"^### {name}\n(.*?)(?=^### |^## )", text, re.S | re.M)
        if name not in spans or section is None:
            missing.append(name)
            continue
        for kind in ("signals", "queries", "updates"):
            missing += [f"{name} {kind} {h}" for h in getattr(definition, kind) if f"`{h}`" not in section.group(1)]
    assert missing == []


def test_the_reference_lists_every_cli_command_and_flag():
    text = _read(REFERENCE)
    missing = []
    for path, parser in leaf_commands(tideplane_parser()):
        command = " ".join(("tideplane", *path))
        section = re.search(rf"^### `{re.escape(command)}`\n(.*?)(?=^### |^## )", text, re.S | re.M)
        if section is None:
            missing.append(command)
            continue
        missing += [f"{command} {o}" for o in _options(parser) - {"-h", "--help"} if f"`{o}`" not in section.group(1)]
    assert missing == []


def test_the_reference_lists_every_setting():
    spans = _reference_code()
    assert [name for name in settings_names() if name.startswith("TIDEPLANE_") and name not in spans] == []
