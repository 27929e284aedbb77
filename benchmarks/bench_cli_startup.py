"""How fast the command answers: `shardwise --help` and `shardwise task check` next to `python -c pass`.

Neither imports torch, mlflow or kfp (the verb's module loads only when it runs). Timed with a CPU-bound process
beside the benchmark, as on a laptop with a browser open; the figure to read is the ratio to `python -c pass`.

    python benchmarks/bench_cli_startup.py [--repeats 15] [--no-load] [--record]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import record

from shardwise.workload import ShardingTask, TableSpec, save_task


def _busy(stop: mp.Event) -> None:  # type: ignore[valid-type]
    x = 0
    while not stop.is_set():
        x = (x * 31 + 7) % 1_000_003


def _median_s(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-load", action="store_true", help="no CPU-bound process beside the benchmark")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/cli_startup.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tables = [TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=4.0) for i in range(8)]
        task = save_task(ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512, tables=tables),
                         Path(tmp) / "task.json")
        shardwise = [sys.executable, "-m", "shardwise.cli"]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "shardwise --help": [*shardwise, "--help"],
            "shardwise task check": [*shardwise, "task", "check", str(task)],
            "shardwise plan --help (loads torch)": [*shardwise, "plan", "--help"],
        }
        stop = mp.Event()
        load = None if args.no_load else mp.Process(target=_busy, args=(stop,), daemon=True)
        if load:
            load.start()
        try:
            medians = {name: _median_s(argv, args.repeats) for name, argv in commands.items()}
        finally:
            stop.set()
    base = medians["python -c pass"]
    rows = [{"command": name, "median_s": round(s, 3), "ratio_to_python": round(s / base, 2)}
            for name, s in medians.items()]
    print(f"{'command':<40} {'median s':>9} {'/ python -c pass':>17}")
    for row in rows:
        print(f"{row['command']:<40} {row['median_s']:>9.3f} {row['ratio_to_python']:>17.2f}")
    if args.record:
        load_note = "no other load" if args.no_load else "one CPU-bound process beside it"
        record("cli_startup", "CLI start-up", rows, notes=f"median of {args.repeats} runs each, {load_note}")


if __name__ == "__main__":
    main()
