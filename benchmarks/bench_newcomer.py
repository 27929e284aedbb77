"""A newcomer's first hour: a fresh clone of main, `make test` and `make run`, with one CPU-bound process beside
them (a laptop with a browser open, a shared CI runner). Prints both times and the line count of `make run`'s
output next to the promises: `make test` green under 12 min, `make run` under 8 min and under 200 lines.

    python benchmarks/bench_newcomer.py [--repo .] [--skip-test] [--keep DIR] [--record]

The clone installs its own .venv (pip, as on a fresh machine); the set-up time is printed apart.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from record import record

TEST_BUDGET_S = 12 * 60
RUN_BUDGET_S = 8 * 60
RUN_LINES = 200


def _busy(stop: mp.Event) -> None:  # type: ignore[valid-type]
    x = 0
    while not stop.is_set():
        x = (x * 31 + 7) % 1_000_003


def _timed(argv: list[str], cwd: Path, log: Path) -> tuple[int, float, int]:
    """(exit status, seconds, lines of output) of one command, its output kept in `log`."""
    started = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    elapsed = time.monotonic() - started
    return status, elapsed, len(log.read_text(errors="replace").splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]), help="repository to clone")
    parser.add_argument("--skip-test", action="store_true", help="time only set-up and `make run`")
    parser.add_argument("--keep", default=None, help="clone here and keep it (default: a temporary directory)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/newcomer.json")
    args = parser.parse_args()

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="shardwise-newcomer-"))
    clone = tmp / "shardwise"
    subprocess.run(["git", "clone", "-q", "--branch", "main", args.repo, str(clone)], check=True)
    stop = mp.Event()
    load = mp.Process(target=_busy, args=(stop,), daemon=True)
    load.start()
    rows = []
    try:
        steps = [("make setup", ["make", "setup"], None, None)]
        if not args.skip_test:
            steps.append(("make test", ["make", "test"], TEST_BUDGET_S, None))
        steps.append(("make run", ["make", "run"], RUN_BUDGET_S, RUN_LINES))
        for name, argv, budget_s, budget_lines in steps:
            status, seconds, lines = _timed(argv, clone, tmp / f"{name.replace(' ', '_')}.log")
            rows.append({
                "command": name, "exit": status, "minutes": round(seconds / 60, 2),
                "budget_minutes": None if budget_s is None else budget_s / 60, "output_lines": lines,
                "budget_lines": budget_lines,
                "ok": status == 0 and (budget_s is None or seconds <= budget_s)
                and (budget_lines is None or lines <= budget_lines),
            })
            print(f"{name:<11} exit {status}  {seconds / 60:5.1f} min"
                  + (f" (budget {budget_s / 60:.0f})" if budget_s else "")
                  + f"  {lines} lines" + (f" (budget {budget_lines})" if budget_lines else "")
                  + f"  log {tmp / (name.replace(' ', '_') + '.log')}")
            if status != 0:
                break
    finally:
        stop.set()
        load.join(timeout=5)
    if args.record:
        record("newcomer", "A newcomer's first hour (fresh clone, one CPU-bound process beside it)", rows,
               notes="make setup installs the pinned CPU stack with pip into a fresh .venv")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
