"""Docs that cannot drift: docs/cli.md is the command's own --help; links in README point at files that exist."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make_cli():  # docs/make_cli.py is a script, not a package module
    spec = importlib.util.spec_from_file_location("make_cli", ROOT / "docs" / "make_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_the_commands_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "110")
    assert (ROOT / "docs" / "cli.md").read_text() == _make_cli().render(), (
        "docs/cli.md is stale: run .venv/bin/python docs/make_cli.py"
    )


def test_readme_links_and_commands_exist():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        assert (ROOT / target).exists(), target
    assert readme.splitlines()[3].startswith("make run") and readme.splitlines()[4].startswith("make test")
    assert len(readme.splitlines()) < 120
