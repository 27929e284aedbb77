"""A newcomer's first hour: a fresh clone of main, `make test`, `make test-all` and `make run`, with one CPU-bound
process beside them (a laptop with a browser open, a shared CI runner), then the README's next step with each of the
three methods. Prints each time next to its promise: `make test` green within 5 min, `make test-all` within 45 min
(half of CI's 90), `make run` within 8 min and under 200 lines, then `shardwise plan --method
neuroshard|dreamshard|autoshard` each working with no further step; and the 15 slowest tests of each test tier
(pytest --durations=15).

    python scripts/newcomer.py [--repo .] [--skip-test] [--keep DIR] [--dry-run] [--record]

The clone installs its own .venv (pip, as on a fresh machine); the set-up time is printed apart.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks' record.py
from benchmarks.record import record  # noqa: E402

TEST_BUDGET_S = 5 * 60
TEST_ALL_BUDGET_S = 45 * 60
RUN_BUDGET_S = 8 * 60
RUN_LINES = 200
SLOWEST = 15
#: pytest's options for both test tiers (Makefile: PYTEST_ARGS)
PYTEST_ARGS = f"PYTEST_ARGS=--durations={SLOWEST}"
SHARDWISE = ".venv/bin/shardwise"
#: the README's first step after `make run`: a task of one's own (then planned by each method)
MY_TASK = [
    [SHARDWISE, "workload", "synth", "--num-tables", "32", "--row-scale", "0.002", "--batch-size", "2048", "--seed",
     "7", "--out", "runs/mine"],
    [SHARDWISE, "workload", "task", "--tables", "runs/mine/tables.json", "--num-tables", "32", "--num-devices", "4",
     "--memory-slack", "2", "--out", "my_task.json"],
]
METHODS = ("neuroshard", "dreamshard", "autoshard")


def _busy(stop: mp.Event) -> None:  # type: ignore[valid-type]
    x = 0
    while not stop.is_set():
        x = (x * 31 + 7) % 1_000_003


def _timed(argvs: list[list[str]], cwd: Path, log: Path) -> tuple[int, float, int]:
    """(exit status, seconds, lines of output) of commands run one after another until one fails, their output
    kept in `log`."""
    started = time.monotonic()
    status = 0
    with log.open("w") as out:
        for argv in argvs:
            status = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
            if status != 0:
                break
    elapsed = time.monotonic() - started
    return status, elapsed, len(log.read_text(errors="replace").splitlines())


def slowest_tests(log_text: str) -> list[str]:
    """The lines of pytest's `slowest N durations` section in a test tier's output."""
    match = re.search(r"=+ slowest \d+ durations =+\n(.*?)(?:\n\n|\n=)", log_text, re.S)
    return [line for line in match.group(1).splitlines() if line.strip()] if match else []


def steps(skip_test: bool) -> list[tuple[str, list[list[str]], float | None, int | None]]:
    """(name, commands, budget seconds, budget lines) of each step, in order."""
    planned: list[tuple[str, list[list[str]], float | None, int | None]] = [("make setup", [["make", "setup"]], None,
                                                                            None)]
    if not skip_test:
        planned.append(("make test", [["make", "test", PYTEST_ARGS]], TEST_BUDGET_S, None))
        planned.append(("make test-all", [["make", "test-all", PYTEST_ARGS]], TEST_ALL_BUDGET_S, None))
    planned.append(("make run", [["make", "run"]], RUN_BUDGET_S, RUN_LINES))
    for method in METHODS:  # each method plans right after `make run`, the task made once, before the first
        made = MY_TASK if method == METHODS[0] else []
        planned.append((f"plan {method}", [*made, [SHARDWISE, "plan", "--task", "my_task.json", "--method", method,
                                                    "--out", f"{method}.json"]], None, None))
    return planned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]), help="repository to clone")
    parser.add_argument("--skip-test", action="store_true", help="time only set-up, `make run` and the plans")
    parser.add_argument("--keep", default=None, help="clone here and keep it (default: a temporary directory)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps and their budgets, run nothing")
    parser.add_argument("--record", action="store_true", help="write a new record under benchmarks/results/newcomer/")
    args = parser.parse_args()

    planned = steps(args.skip_test)
    if args.dry_run:
        for name, argvs, budget_s, budget_lines in planned:
            budget = f"budget {budget_s / 60:.0f} min" if budget_s else "no time budget"
            lines = f", {budget_lines} lines" if budget_lines else ""
            print(f"{name:<16} {budget}{lines}: " + " && ".join(" ".join(a) for a in argvs))
        return
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="shardwise-newcomer-"))
    clone = tmp / "shardwise"
    subprocess.run(["git", "clone", "-q", "--branch", "main", args.repo, str(clone)], check=True)
    stop = mp.Event()
    load = mp.Process(target=_busy, args=(stop,), daemon=True)
    load.start()
    rows = []
    slowest: dict[str, list[str]] = {}
    try:
        for name, argvs, budget_s, budget_lines in planned:
            log = tmp / f"{name.replace(' ', '_')}.log"
            status, seconds, lines = _timed(argvs, clone, log)
            rows.append({
                "command": name, "exit": status, "minutes": round(seconds / 60, 2),
                "budget_minutes": None if budget_s is None else budget_s / 60, "output_lines": lines,
                "budget_lines": budget_lines,
                "ok": status == 0 and (budget_s is None or seconds <= budget_s)
                and (budget_lines is None or lines <= budget_lines),
            })
            print(f"{name:<16} exit {status}  {seconds / 60:5.1f} min"
                  + (f" (budget {budget_s / 60:.0f})" if budget_s else "")
                  + f"  {lines} lines" + (f" (budget {budget_lines})" if budget_lines else "")
                  + f"  log {log}")
            if name.startswith("make test"):
                slowest[name] = slowest_tests(log.read_text(errors="replace"))
                print(f"  the {SLOWEST} slowest tests of `{name}`:", *slowest[name], sep="\n    ")
            if status != 0:
                break
    finally:
        stop.set()
        load.join(timeout=5)
    if args.record:
        notes = "make setup installs the pinned CPU stack with pip into a fresh .venv; " + "; ".join(
            f"the {SLOWEST} slowest tests of `{name}`: " + ", ".join(line.split()[0] + " " + line.split()[-1]
                                                                      for line in lines)
            for name, lines in slowest.items())
        record("newcomer", "A newcomer's first hour (fresh clone, one CPU-bound process beside it)", rows,
               notes=notes, code=clone)  # the clone's commit: the repository may have moved on meanwhile
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
