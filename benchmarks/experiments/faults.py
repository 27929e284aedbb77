"""Faults of the services around shardwise, injected into real runs several times each: every scenario
tests/unit/fault_injection.py defines (a public function `(tmp, ...) -> FaultOutcome`: the object store stopped
while `profile --out s3://...` writes, the MLflow tracking server SIGKILLed while `pretrain` / `train-policy`
registers, two runs registering to one registry at once, a store's making killed, `pipeline run --local` SIGKILLed
in a step, and any scenario added there). Each try counts rows lost, rows stored twice and wrong or half-logged
champions (the fault suite's checks, tests/faults, on the same scenarios), the seconds from the fault to the tool's
one-line error, and whether the rerun finished. A scenario this module knows varies over its tries (when the fault
strikes); a new one runs with its defaults.

    python -m benchmarks faults --tries 5 --pipeline-tries 5 --record
    python -m benchmarks faults --faults profile_store_stopped,concurrent_registration --tries 2
"""

from __future__ import annotations

import functools
import inspect
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks import harness

#: the scenario that runs a whole pipeline (minutes a try): --pipeline-tries
PIPELINE = "pipeline_killed"
#: how a known scenario varies over its tries, try k: when the fault strikes
_PIPELINE_KILLS = (("profile-costs", 2.0, False), ("pretrain-cost-model", 1.0, True), ("train-policies", 2.0, False),
                   ("profile-all-to-alls", 2.0, False), ("evaluate-plans", 2.0, False),
                   ("pretrain-cost-model", 2.0, False))
LABELS = {
    "profile_store_stopped": "object store stopped during profile --out s3://",
    "registration_server_killed": "tracking server SIGKILLed during pretrain / train-policy registration",
    "concurrent_registration": "two runs registering to one registry at once",
    "plan_registration_server_killed": "tracking server SIGKILLed during a plan's registration (publish)",
    "concurrent_plan_registration": "two runs registering a plan of one task at once",
    PIPELINE: "pipeline run --local SIGKILLed in a step (one try: while it makes the MLflow store), rerun",
}
ONE_LINE_ERRORS = (" One-line errors: of the tries where the fault made the command fail; a command still running "
                   "at the kill that exits 0 had finished its registration before the kill reached it, and counts "
                   "as right only where that version is whole (the gate's decision on it, its alias moved), else as "
                   "a wrong champion.")


class FaultsSettings(harness.ExperimentSettings):
    """Which scenarios, how many tries each."""

    tries: int = Field(default=5, ge=1, description="injections of each fault")
    pipeline_tries: int | None = Field(default=None, ge=0, description=f"injections of {PIPELINE}, a few minutes "
                                       "each (default: --tries)")
    faults: tuple[str, ...] | None = Field(default=None, description="comma-separated scenarios of "
                                           "tests/unit/fault_injection.py (default: every one)",
                                           json_schema_extra={"sep": ","})


def scenarios() -> dict[str, Callable[..., Any]]:
    """Every scenario tests/unit/fault_injection.py defines: its public functions of a `tmp` folder that return a
    FaultOutcome, by name, in the module's order."""
    module = harness.test_helpers("fault_injection")
    found = {}
    for name, function in inspect.getmembers(module, inspect.isfunction):
        if name.startswith("_") or function.__module__ != module.__name__:
            continue
        parameters = list(inspect.signature(function).parameters)
        if parameters[:1] == ["tmp"] and str(inspect.signature(function).return_annotation) == "FaultOutcome":
            found[name] = function
    return dict(sorted(found.items(), key=lambda item: item[1].__code__.co_firstlineno))


@functools.cache
def _fault_free_costs() -> Any:
    """The cost rows a local pipeline run nobody kills pre-trains on (once per benchmark run)."""
    injection = harness.test_helpers("fault_injection")
    with tempfile.TemporaryDirectory(prefix="bench-faults-pipeline-") as tmp:
        subprocess.run(injection.pipeline_run(Path(tmp)), check=True, capture_output=True, timeout=1800)
        return injection.pipeline_costs(Path(tmp) / "run")


def one_try(name: str, function: Callable[..., Any], tmp: Path, k: int) -> Any:
    """Try `k` of scenario `name`: a known scenario's variation, a new one's defaults."""
    if name == "profile_store_stopped":  # before the second part (25 rows safe), or before the first (none yet)
        return function(tmp, num_shards=60, stop_before_row=(50, 25)[k % 2])
    if name == "registration_server_killed":  # from the moment the version appears to 1 s after
        return function(tmp, verb=("pretrain", "train-policy")[k % 2], delay_s=(0.0, 0.0, 0.3, 0.3, 1.0, 1.0)[k % 6])
    if name == "concurrent_registration":  # the better run first or second, at once or up to 1 s apart
        offsets = ((0.0, 0.0), (0.0, 0.3), (0.0, 0.3), (0.0, 1.0), (0.0, 1.0), (0.0, 0.0))[k % 6]
        return function(tmp, costs=((5.0, 3.0), (3.0, 5.0))[k % 2], offsets_s=offsets)
    if name == "plan_registration_server_killed":  # from the moment the plan's version appears to 0.6 s after
        return function(tmp, delay_s=(0.0, 0.05, 0.1, 0.3, 0.6)[k % 5])
    if name == "concurrent_plan_registration":  # the faster plan first or second, at once or 0.3 s apart
        offsets = ((0.0, 0.0), (0.0, 0.3), (0.3, 0.0), (0.0, 0.0), (0.0, 0.3))[k % 5]
        return function(tmp, ms=((5.0, 3.0), (3.0, 5.0))[k % 2], offsets_s=offsets)
    if name == PIPELINE:
        step, delay_s, at_store_creation = _PIPELINE_KILLS[k % len(_PIPELINE_KILLS)]
        return function(tmp, step=step, delay_s=delay_s, expected=_fault_free_costs(),
                        at_store_creation=at_store_creation)
    return function(tmp)


def _seconds(values: list[float]) -> str | None:
    return f"{statistics.median(values):.1f} / {max(values):.1f}" if values else None


def run_fault(name: str, function: Callable[..., Any], tries: int) -> dict[str, Any]:
    """`tries` injections of one scenario, summed; each try's line printed as it ends."""
    outcomes = []
    started = time.monotonic()
    for k in range(tries):
        with tempfile.TemporaryDirectory(prefix=f"bench-faults-{name}-") as tmp:
            outcome = one_try(name, function, Path(tmp), k)
        outcomes.append(outcome)
        print(f"  {name} try {k + 1}: lost {outcome.rows_lost}, twice {outcome.duplicated_rows}, wrong champions "
              f"{outcome.wrong_champions}, error after {outcome.seconds_to_error}: {outcome.error[:160]}",
              flush=True)
    errors = [o.seconds_to_error for o in outcomes if o.seconds_to_error is not None]
    return {
        "fault": LABELS.get(name, outcomes[0].fault if outcomes else name),
        "scenario": name,
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


def run(settings: FaultsSettings, context: harness.Context) -> harness.Outcome:
    """Inject each scenario `tries` times; one row per scenario."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs each request
    found = scenarios()
    wanted = settings.faults or tuple(found)
    if unknown := sorted(set(wanted) - set(found)):
        raise harness.BenchmarkError(f"--faults: no scenario {', '.join(unknown)} in tests/unit/fault_injection.py; there are "
                         f"{', '.join(found)}")
    rows = []
    for name in wanted:
        tries = settings.pipeline_tries if name == PIPELINE and settings.pipeline_tries is not None else settings.tries
        print(f"{name}: {tries} tries", flush=True)
        rows.append(run_fault(name, found[name], tries))
    bad = [r["scenario"] for r in rows if r["rows lost"] or r["duplicated rows"] or r["wrong champions"]
           or r["reruns that failed"]]
    return harness.Outcome(rows, notes=[
        "Each try is a real run on loopback (moto's S3 server, an `mlflow server`), faulted and rerun: rows lost and "
        "stored twice are counted against a fault-free run of the same command, a wrong champion is an alias on a "
        "version without the gate's decision for it, a champion moved by a run that never finished, or (two runs "
        "at once) a champion that is not the lower cost. Seconds to the error: from the fault to the tool's exit "
        "(the store: including the few shards measured before the next write)." + ONE_LINE_ERRORS],
        failed=f"rows lost or duplicated, a wrong champion or a failed rerun in {', '.join(bad)}" if bad else None)


harness.register(harness.Experiment(
    name="faults",
    title="Faults survived: store, tracking server and registry faults injected into real runs",
    settings=FaultsSettings,
    run=run,
    threads=None,
    suites={"claims": (harness.SuiteRun({"tries": 5, "pipeline_tries": 5}),)},
))
