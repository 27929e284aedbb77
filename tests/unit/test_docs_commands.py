"""The command blocks of README.md and docs/*.md name only what exists: every `shardwise` verb and option (parsed
against the CLI's own parser), every `make` target (the Makefile), every file of the repository, and every flag
of a `python benchmarks/X.py` (that script's argparse) and of a `python -m benchmarks NAME` (the experiment's
flags, made from its settings by the harness). Blocks are the ```bash fences; commands in them are read
the way a shell splits them (continuations joined, comments dropped, `&&`/`;`/`|` chains split); the guide's
synopsis notation (`[--opt V]`, `a|b`) is read as the options and values it names."""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shardwise.cli import VERBS, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: what the shell runs for `shardwise`: the venv's script (README) or the activated venv's
SHARDWISE = {"shardwise", ".venv/bin/shardwise"}
PYTHON = {"python", "python3", ".venv/bin/python", ".venv/bin/python3"}
_FENCE = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.M | re.S)
_CHAIN = re.compile(r"\s(?:&&|\|\||;|\|)\s")


def _commands(block: str) -> list[list[str]]:
    """The block's commands as the shell's words: continuations joined, comments dropped, chains split."""
    text = re.sub(r"\\\n", " ", block)
    commands = []
    for line in text.splitlines():
        for part in _CHAIN.split(line):
            words = shlex.split(part, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
                words = words[1:]
            if words:
                commands.append(words)
    return commands


def _all_commands() -> list[tuple[str, list[str]]]:
    return [(f"{doc.relative_to(ROOT)}: {' '.join(words)[:90]}", words)
            for doc in DOCS for block in _FENCE.findall(doc.read_text()) for words in _commands(block)]


COMMANDS = _all_commands()


def _synopsis_words(words: list[str]) -> list[str]:
    """`[--refine-budget-s S]` -> `--refine-budget-s S`: the guide's optional parts are named options too."""
    return [w.strip("[]") for w in words if w.strip("[]") not in ("", "...")]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@functools.cache
def _verb_parser(verb: str) -> argparse.ArgumentParser:
    return _subparsers(build_parser(verb))[verb]


def _check_shardwise(words: list[str]) -> None:
    args = _synopsis_words(words[1:])
    verb = args[0]
    assert verb in VERBS, f"`shardwise {verb}`: no such verb (verbs: {', '.join(VERBS)})"
    parser, rest = _verb_parser(verb), args[1:]
    actions = _subparsers(parser)
    optional = any(isinstance(a, argparse._SubParsersAction) and not a.required for a in parser._actions)
    if actions and not (optional and (not rest or rest[0].startswith("-"))):  # `plan --task ...`, or `plan show URI`
        assert rest and rest[0] in actions, f"`shardwise {verb} {rest[:1]}`: actions are {', '.join(actions)}"
        parser, rest = actions[rest[0]], rest[1:]
    options = {s: a for a in parser._actions for s in a.option_strings}
    for i, word in enumerate(rest):
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        assert name in options, f"`shardwise {verb}` has no option {name}"
        choices = options[name].choices
        value = rest[i + 1] if i + 1 < len(rest) else ""
        if choices and value and not value.startswith("-") and not value.isupper():  # URI, N: placeholders
            for alternative in value.split("|"):
                assert alternative in map(str, choices), f"`shardwise {verb} {name} {alternative}`: choices are {choices}"


@functools.cache
def _make_targets() -> frozenset[str]:
    return frozenset(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def _check_make(words: list[str]) -> None:
    for word in words[1:]:
        if not word.startswith("-") and "=" not in word:
            assert word in _make_targets(), f"`make {word}`: no such target in the Makefile"


@functools.cache
def _script_flags(script: Path) -> frozenset[str]:
    """The option strings a script's argparse declares (read from its source: nothing is imported or run)."""
    flags = {"-h", "--help"}
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return frozenset(flags)


@functools.cache
def _benchmarks_parser() -> argparse.ArgumentParser:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the benchmarks package, beside src/
    from benchmarks.harness import build_parser

    return build_parser()


def _check_options(parser: argparse.ArgumentParser, rest: list[str], what: str) -> None:
    """Every `--option` of `rest` is one of `parser`'s, and a value of an option with choices is one of them."""
    options = {s: a for a in parser._actions for s in a.option_strings}
    for i, word in enumerate(rest):
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        assert name in options, f"`{what}` has no option {name}"
        choices = options[name].choices
        value = rest[i + 1] if i + 1 < len(rest) else ""
        if choices and value and not value.startswith("-") and not value.isupper():  # URI, N: placeholders
            for alternative in value.split("|"):
                assert alternative in map(str, choices), f"`{what} {name} {alternative}`: choices are {choices}"


def _check_benchmarks(words: list[str]) -> None:
    """`python -m benchmarks [NAME] [flags]`: the experiment is registered and its flags are its own."""
    args = _synopsis_words(words)
    parser = _benchmarks_parser()
    experiments = _subparsers(parser)
    named = [w for i, w in enumerate(args) if not w.startswith("-") and (i == 0 or args[i - 1] != "--suite")]
    if not named:
        _check_options(parser, args, "python -m benchmarks")
        return
    assert named[0] in experiments, f"`python -m benchmarks {named[0]}`: no such experiment (experiments: " \
                                    f"{', '.join(experiments)})"
    _check_options(experiments[named[0]], args[args.index(named[0]) + 1:], f"python -m benchmarks {named[0]}")


def _check_python(words: list[str]) -> None:
    if words[1:3] == ["-m", "benchmarks"]:
        _check_benchmarks(words[3:])
        return
    scripts = [w for w in words[1:2] if w.endswith(".py")]
    if not scripts:
        return  # python -m / -c: modules are checked by importing them elsewhere
    script = ROOT / scripts[0]
    if not script.exists() and "/" not in scripts[0]:
        script = ROOT / "benchmarks" / scripts[0]  # results.md's records name the ones run inside benchmarks/
    assert script.is_file(), f"`{' '.join(words[:2])}`: no such script"
    for word in words[2:]:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            assert word.split("=", 1)[0] in _script_flags(script), f"{scripts[0]} has no option {word}"


@functools.cache
def _tracked_top() -> frozenset[str]:
    """The repository's top-level folders (a path under one of them names a file of the repository)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return frozenset(f.split("/", 1)[0] for f in files.splitlines() if "/" in f)


def _check_paths(words: list[str]) -> None:
    for word in _synopsis_words(words):
        for path in word.split(","):
            top = path.split("/", 1)[0]
            if "/" in path and top in _tracked_top() and not re.search(r"[{}*$<>]", path):
                assert (ROOT / path).exists(), f"{path}: no such file in the repository"


def test_the_docs_have_command_blocks_to_check():
    programs = {words[0] for _, words in COMMANDS}
    assert len(COMMANDS) > 40 and {"make", ".venv/bin/shardwise", "shardwise", "python"} <= programs


@pytest.mark.parametrize("where, words", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_names_what_exists(where, words):
    program = words[0]
    if program in SHARDWISE:
        _check_shardwise(words)
    elif program == "make":
        _check_make(words)
    elif program in PYTHON:
        _check_python(words)
    _check_paths(words)


@pytest.mark.parametrize("command, message", [
    ("shardwise plann --task t.json", "no such verb"),
    ("shardwise plan --task t.json --methodd x", "no option --methodd"),
    ("shardwise train-policy --method dreamshard|neuroshard", "choices are"),
    ("shardwise pipeline launch --local", "actions are"),
    ("make tests", "no such target"),
    ("python benchmarks/make_results.py --chek", "no option --chek"),
    ("python benchmarks/bench_nothing.py", "no such script"),
    ("python -m benchmarks plan_quality --smal", "no option --smal"),
    ("python -m benchmarks plan_qualty --small", "no such experiment"),
    ("python -m benchmarks --suite quik", "choices are"),
    (".venv/bin/shardwise task check docs/nothing.md", "no such file"),
])
def test_a_command_that_names_what_does_not_exist_is_caught(command, message):
    with pytest.raises(AssertionError, match=message):
        test_a_documented_command_names_what_exists("", shlex.split(command))


def test_the_container_steps_get_an_engine_then_the_base_then_the_image_they_build_on():
    """deploy.md's pipeline in containers, on a fresh machine: an engine, then the base image `make base-image`
    tags, then the CPU image on that base (no registry is reachable here), then the run, in that order."""
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    (block,) = [b for b in _FENCE.findall(deploy) if "--containers --preset" in b]
    lines = [" ".join(words) for words in _commands(block)]
    base_tag = re.search(r"^base-image:\n\t\S+ (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    order = ["make setup", "apt-get install -y docker.io", "dockerd", "make base-image",
             f"make image-cpu BASE_IMAGE={base_tag}", ".venv/bin/shardwise pipeline run --local --containers"]
    found = [next((i for i, line in enumerate(lines) if step in line), None) for step in order]
    assert None not in found and found == sorted(found), dict(zip(order, found))
