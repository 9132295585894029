"""The ``warren ...`` command lines README.md and docs/*.md show, in blocks and in
the text, checked against the commands' own argparse parsers (subcommands and
option names exist). The pages and their blocks: doc_snippets."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from doc_snippets import ROOT, Block, console_steps

_COMMAND = re.compile(r"^(?:\.venv/bin/)?(warren|warrenctl)$")


def _parser_for(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The argparse parser of a ``warren``/``warrenctl`` command and its remaining words."""
    from warren import cli, orphans_cli, users_cli
    from warren.ctl import main as ctl_main
    from warren.perf import cli as perf_cli

    if words[0].endswith("warrenctl"):
        return ctl_main.build_parser(), words[1:]
    tools = {
        "ctl": ctl_main.build_parser,
        "perf": perf_cli.build_parser,
        "users": users_cli.build_parser,
        "orphans": orphans_cli.build_parser,
    }
    if len(words) > 1 and words[1] in tools:
        return tools[words[1]](), words[2:]
    return cli.build_parser(), words[1:]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_command(line: str) -> str | None:
    """Why a ``warren ...`` command line shown in a page would not parse, or None.

    Walks the subcommands and checks every option name against argparse's
    parsers; values and positional arguments may be placeholders.
    """
    if not line.split() or not _COMMAND.match(line.split()[0]):
        return None
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError as e:
        return f"cannot split {line!r}: {e}"
    for i, word in enumerate(words):
        if word and set(word) <= set("|;&<>()"):  # the shell's: the command ends
            words = words[:i]
            break
    parser, rest = _parser_for(words)
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if word == "..." or word.startswith("<"):
            continue
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            action = parser._option_string_actions.get(name)
            if action is None:
                return f"{line!r}: {parser.prog} has no option {name}"
            if action.nargs != 0 and "=" not in word:
                i += 1  # its value
            continue
        subs = _subparsers(parser)
        if subs:
            if word not in subs and not all(w in subs for w in word.split("|")):
                return f"{line!r}: {parser.prog} has no subcommand {word!r} ({', '.join(subs)})"
            parser = subs[word.split("|")[0]]
    return None


def command_lines(block: Block) -> list[str]:
    """The command lines of an sh or console block, continuation lines joined."""
    text = block.text
    if block.language == "console":
        text = "\n".join(c for c, _ in console_steps(text))
    text = text.replace("\\\n", " ")
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


_INLINE = re.compile(r"`((?:\.venv/bin/)?warren(?:ctl)? [^`]+)`")


def inline_commands(path: Path) -> list[tuple[str, str]]:
    """``warren ...`` commands quoted in a page's text: (where, command)."""
    rel = str(path.relative_to(ROOT))
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    found = []
    for m in _INLINE.finditer(text.replace("\n", " ")):
        command = m.group(1)
        second = command.split()[1]
        if second.endswith(":") or second[0].isdigit():  # output quoted, not a command
            continue
        line = text[: m.start()].count("\n") + 1
        found.append((f"{rel}:{line}", command))
    return found
