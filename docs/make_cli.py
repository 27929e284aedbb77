"""Regenerate docs/cli.md from the command's own `--help` (tests/unit/test_docs.py fails when it is stale).

    .venv/bin/python docs/make_cli.py [--check]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

from shardwise.cli import VERBS, build_parser

DOC = Path(__file__).resolve().with_name("cli.md")


def _help(parser: argparse.ArgumentParser) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        parser.print_help()
    return out.getvalue().rstrip()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def render() -> str:
    """The whole page: `shardwise --help`, then every verb's (and action's) help."""
    os.environ["COLUMNS"] = "110"  # argparse wraps to the terminal: fix the width so the page is reproducible
    parts = [
        "# shardwise: command line",
        "",
        "Generated from `--help` by `python docs/make_cli.py`; every option comes from a job's settings model "
        "(`shardwise.jobs`), so this page and the code cannot disagree.",
        "",
        "```text",
        _help(build_parser()),
        "```",
    ]
    for verb in VERBS:
        parser = _subparsers(build_parser(verb))[verb]
        actions = _subparsers(parser)
        for name, sub in [(verb, parser), *((f"{verb} {a}", p) for a, p in actions.items())]:
            parts += ["", f"## shardwise {name}", "", "```text", _help(sub), "```"]
    return "\n".join(parts) + "\n"


def main() -> int:
    """Write docs/cli.md, or with --check say whether it is current."""
    text = render()
    if "--check" in sys.argv[1:]:
        if DOC.read_text() != text:
            print(f"{DOC} is stale: run python docs/make_cli.py")
            return 1
        return 0
    DOC.write_text(text)
    print(DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
