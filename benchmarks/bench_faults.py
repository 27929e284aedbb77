"""Faults of the services around shardwise, injected into real runs several times each: the object store stopped
while `profile --out s3://...` writes, the MLflow tracking server SIGKILLed while `pretrain` / `train-policy`
registers, two runs registering to one registry at once, and `pipeline run --local` SIGKILLed in a step. Each try
counts rows lost, rows stored twice and wrong or half-logged champions (the fault suite's checks, tests/faults, on
the same scenarios: tests/unit/fault_injection.py), the seconds from the fault to the tool's one-line error, and
whether the rerun finished.

    python benchmarks/bench_faults.py [--tries 5] [--pipeline-tries N] [--faults store registration concurrent pipeline]
                                      [--record]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))  # the fault scenarios

from fault_injection import (  # noqa: E402
    FaultOutcome,
    concurrent_registration,
    pipeline_costs,
    pipeline_killed,
    pipeline_run,
    profile_store_stopped,
    registration_server_killed,
)
from record import record  # noqa: E402


def _store(tmp: Path, k: int) -> FaultOutcome:
    # before the second part (25 rows safe), or before the first (none yet)
    return profile_store_stopped(tmp, num_shards=60, stop_before_row=(50, 25)[k % 2])


def _registration(tmp: Path, k: int) -> FaultOutcome:
    # pretrain and train-policy in turn, killed from the moment the version appears to 1 s after (the gate's
    # comparison, the evidence, the alias)
    return registration_server_killed(tmp, verb=("pretrain", "train-policy")[k % 2],
                                      delay_s=(0.0, 0.0, 0.3, 0.3, 1.0, 1.0)[k % 6])


def _concurrent(tmp: Path, k: int) -> FaultOutcome:
    # the better run first or second, at once or up to 1 s apart
    costs = ((5.0, 3.0), (3.0, 5.0))[k % 2]
    offsets = ((0.0, 0.0), (0.0, 0.3), (0.0, 0.3), (0.0, 1.0), (0.0, 1.0), (0.0, 0.0))[k % 6]
    return concurrent_registration(tmp, costs=costs, offsets_s=offsets)


@functools.cache
def _fault_free_costs() -> Any:
    """The cost rows a local pipeline run nobody kills pre-trains on (once per benchmark run)."""
    with tempfile.TemporaryDirectory(prefix="bench-faults-pipeline-") as tmp:
        subprocess.run(pipeline_run(Path(tmp)), check=True, capture_output=True, timeout=1800)
        return pipeline_costs(Path(tmp) / "run")


#: SIGKILL in a profiling worker, pre-training while it makes the MLflow store (1 s into MLflow's tables and
#: migrations), the policies' training, the all-to-alls, the evaluation, pre-training 2 s in
_PIPELINE_KILLS = (("profile-costs", 2.0, False), ("pretrain-cost-model", 1.0, True), ("train-policies", 2.0, False),
                   ("profile-all-to-alls", 2.0, False), ("evaluate-plans", 2.0, False),
                   ("pretrain-cost-model", 2.0, False))


def _pipeline(tmp: Path, k: int) -> FaultOutcome:
    step, delay_s, at_store_creation = _PIPELINE_KILLS[k % len(_PIPELINE_KILLS)]
    return pipeline_killed(tmp, step=step, delay_s=delay_s, expected=_fault_free_costs(),
                           at_store_creation=at_store_creation)


FAULTS: dict[str, Callable[[Path, int], FaultOutcome]] = {
    "store": _store, "registration": _registration, "concurrent": _concurrent, "pipeline": _pipeline,
}
LABELS = {
    "store": "object store stopped during profile --out s3://",
    "registration": "tracking server SIGKILLed during pretrain / train-policy registration",
    "concurrent": "two runs registering to one registry at once",
    "pipeline": "pipeline run --local SIGKILLed in a step (one try: while it makes the MLflow store), rerun",
}


ONE_LINE_ERRORS = (" One-line errors: of the tries where the fault made the command fail; a command still running "
                   "at the kill that exits 0 had finished its registration before the kill reached it, and counts "
                   "as right only where that version is whole (the gate's decision on it, its alias moved), else as "
                   "a wrong champion.")


def _seconds(values: list[float]) -> str | None:
    return f"{statistics.median(values):.1f} / {max(values):.1f}" if values else None


def run_fault(name: str, tries: int) -> dict[str, Any]:
    """`tries` injections of one fault, summed; each try's line printed as it ends."""
    outcomes = []
    started = time.monotonic()
    for k in range(tries):
        with tempfile.TemporaryDirectory(prefix=f"bench-faults-{name}-") as tmp:
            outcome = FAULTS[name](Path(tmp), k)
        outcomes.append(outcome)
        print(f"  {name} try {k + 1}: lost {outcome.rows_lost}, twice {outcome.duplicated_rows}, wrong champions "
              f"{outcome.wrong_champions}, error after {outcome.seconds_to_error}: {outcome.error[:160]}",
              flush=True)
    errors = [o.seconds_to_error for o in outcomes if o.seconds_to_error is not None]
    return {
        "fault": LABELS[name],
        "tries": tries,
        "rows lost": sum(o.rows_lost for o in outcomes),
        "duplicated rows": sum(o.duplicated_rows for o in outcomes),
        "wrong champions": sum(o.wrong_champions for o in outcomes),
        "seconds to the error (median / max)": _seconds(errors),
        "one-line errors": f"{sum(bool(o.error) and ': error: ' in o.error for o in outcomes)} / {len(errors)}"
        if errors else None,
        "reruns that failed": sum(o.notes.get("rerun_exit", 0) != 0 for o in outcomes),
        "finished steps run again": sum(len(o.notes.get("ran_again", [])) for o in outcomes),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }


def _quiet_harness() -> None:
    """The scenarios' own services and checks in this process say nothing on the console, as the CLI without -v:
    MLflow's waits and download bars, and moto's server, which logs each request."""
    import logging

    from shardwise.cli import quiet_libraries

    quiet_libraries(verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Inject each fault `--tries` times; print the table (and record it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=5, help="injections of each fault (default 5)")
    parser.add_argument("--pipeline-tries", type=int, default=None,
                        help="injections of the pipeline fault, a few minutes each (default: --tries)")
    parser.add_argument("--faults", nargs="+", choices=sorted(FAULTS), default=list(FAULTS),
                        help="which faults (default: all)")
    parser.add_argument("--record", action="store_true", help="write benchmarks/results/faults.json")
    args = parser.parse_args(argv)
    _quiet_harness()
    rows = []
    for name in args.faults:
        tries = args.pipeline_tries if name == "pipeline" and args.pipeline_tries is not None else args.tries
        print(f"{name}: {tries} tries", flush=True)
        rows.append(run_fault(name, tries))
    columns = list(rows[0])
    print("\n" + " | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    if args.record:
        record("faults", "Faults survived: store, tracking server and registry faults injected into real runs", rows,
               notes="Each try is a real run on loopback (moto's S3 server, an `mlflow server`), faulted and rerun: "
                     "rows lost and stored twice are counted against a fault-free run of the same command, a wrong "
                     "champion is an alias on a version without the gate's decision for it, a champion moved by a "
                     "run that never finished, or (two runs at once) a champion that is not the lower cost. Seconds "
                     "to the error: from the fault to the tool's exit (the store: including the few shards measured "
                     "before the next write)." + ONE_LINE_ERRORS + " Timings on a shared 2-core machine under other engineers' load.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
