"""``tideplane completion bash|zsh``: a shell completion script generated from the parser itself, so
it never lists a command or flag the CLI lacks. ``source <(tideplane completion bash)``."""

from __future__ import annotations

import argparse

from workers.config import Settings


def _tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    """Command path -> the words that may follow it (subcommands, then flags)."""
    words: list[str] = []
    tree: dict[tuple[str, ...], list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words.append(name)
                tree.update(_tree(sub, (*path, name)))
        else:
            words += [o for o in action.option_strings if o.startswith("--")]
    tree[path] = words
    return tree


def bash_script(parser: argparse.ArgumentParser) -> str:
    cases = "\n".join(
        f'        "{" ".join(path)}") words="{" ".join(words)}" ;;' for path, words in sorted(_tree(parser).items()) if path
    )
    top = " ".join(_tree(parser)[()])
    return f"""# tideplane bash completion: source <(tideplane completion bash)
_tideplane() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" w words="{top}" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        [[ "$w" == -* ]] && continue
        case "${{path:+$path }}$w" in
{cases.replace('        "', '            "')}
            *) continue ;;
        esac
        path="${{path:+$path }}$w"
    done
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _tideplane tideplane
"""


def cmd_completion(args, config: Settings) -> int:
    script = bash_script(args.root_parser)
    if args.shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    print(script, end="")
    return 0


def add_completion_command(subparsers, root: argparse.ArgumentParser) -> None:
    """``root`` is the whole CLI's parser, the one the script is generated from."""
    p = subparsers.add_parser("completion", help="print a shell completion script: source <(tideplane completion bash)")
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=cmd_completion, root_parser=root)
