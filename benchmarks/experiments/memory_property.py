"""Memory safety at scale: seeded random tasks through every method, each plan checked by arithmetic of its own
(tests/unit/memory_property.py: the tasks, the check and the tallies). Per method: tasks, plans, plans over memory,
mis-tiled plans, infeasible tasks answered with a plan (must be 0), refusals (each must say why) and how many of
them another method did plan (a weaker search), and seconds. The 10,000 tasks take hours on 2 cores: `--chunk`
saves a range's tallies under benchmarks/results/memory_property/, `--merge` adds the saved ranges up.

    python -m benchmarks memory_property --tasks 500                       # a sample
    python -m benchmarks memory_property --start 2000 --tasks 250 --chunk  # one piece, saved
    python -m benchmarks memory_property --merge --record                  # the pieces added up
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from pydantic import Field

from benchmarks import harness
from benchmarks.record import RESULTS

#: where `--chunk` runs keep their tallies (one file per range of tasks; `--merge` adds them up)
CHUNKS = RESULTS / "memory_property"
#: the tallies' fields that add up over chunks of tasks
COUNTS = ("tasks", "plans", "over_memory", "mis_tiled", "infeasible_planned", "refused", "refused_feasible",
          "refused_without_reason", "skipped")


class MemoryPropertySettings(harness.ExperimentSettings):
    """Which random tasks, and whether to save or add up ranges of them."""

    tasks: int = Field(default=10_000, ge=1, description="random tasks (each through every method)")
    start: int = Field(default=0, ge=0, description="index of the first task (task i is the same in every run: "
                       "ranges of one run add up)")
    seed: int = 0
    max_tables: int = Field(default=500, ge=1)
    max_devices: int = Field(default=128, ge=1)
    torchrec_max_tables: int = Field(default=100, ge=0, description="TorchRec's planner only on tasks up to this "
                                     "many tables (its column-wise search is slow)")
    chunk: bool = Field(default=False, description="save this range's tallies under "
                        "benchmarks/results/memory_property/ (to add up with --merge)")
    merge: bool = Field(default=False, description="add up the saved ranges instead of planning")


def save_chunk(tallies: dict[str, Any], settings: MemoryPropertySettings) -> None:
    """One range of tasks' tallies as a JSON file under CHUNKS, named by its range."""
    CHUNKS.mkdir(parents=True, exist_ok=True)
    path = CHUNKS / f"tasks-{settings.start:05d}-{settings.start + settings.tasks - 1:05d}.json"
    doc = {**settings.model_dump(include={"seed", "start", "tasks", "max_tables", "max_devices",
                                          "torchrec_max_tables"}),
           "date": dt.date.today().isoformat(),
           "methods": {name: {**{k: getattr(t, k) for k in COUNTS}, "seconds": round(t.seconds, 1),
                              "first_refusal": t.first_refusal, "failures": t.failures}
                       for name, t in tallies.items()}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    print(f"saved {path}")


def merged_chunks(seed: int) -> tuple[dict[str, Any], int, list[str]]:
    """The tallies of every saved range of `seed` added up, the tasks they cover, and the ranges (refused when two
    overlap: a task counted twice would inflate the figure)."""
    check = harness.test_helpers("memory_property")
    tallies: dict[str, Any] = {}
    covered: set[int] = set()
    ranges = []
    for path in sorted(CHUNKS.glob("tasks-*.json")):
        doc = json.loads(path.read_text())
        if doc["seed"] != seed:
            continue
        span = set(range(doc["start"], doc["start"] + doc["tasks"]))
        if span & covered:
            raise harness.BenchmarkError(f"{path}: its tasks overlap another saved range's; remove one of them")
        covered |= span
        ranges.append(f"{doc['start']}-{doc['start'] + doc['tasks'] - 1}")
        for name, counts in doc["methods"].items():
            t = tallies.setdefault(name, check.Tally())
            for k in COUNTS:
                setattr(t, k, getattr(t, k) + counts[k])
            t.seconds += counts["seconds"]
            t.first_refusal = t.first_refusal or counts["first_refusal"]
            t.failures += counts["failures"]
    return tallies, len(covered), ranges


def run(settings: MemoryPropertySettings, context: harness.Context) -> harness.Outcome:
    """Plan the tasks with every method (or add up saved ranges); one row per method."""
    check = harness.test_helpers("memory_property")
    if settings.merge:
        tallies, covered, ranges = merged_chunks(settings.seed)
        source = f", added up from {len(ranges)} ranges saved in benchmarks/results/memory_property/"
    else:
        tallies = check.run(settings.tasks, settings.seed, start=settings.start, max_tables=settings.max_tables,
                            max_devices=settings.max_devices, torchrec_max_tables=settings.torchrec_max_tables)
        covered, source = settings.tasks, ""
        if settings.chunk:
            save_chunk(tallies, settings)
    rows = [{"method": name, "tasks": t.tasks, "plans": t.plans, "over_memory": t.over_memory,
             "mis_tiled": t.mis_tiled, "infeasible_planned": t.infeasible_planned, "refused": t.refused,
             "refused_but_planned_by_another": t.refused_feasible, "seconds": round(t.seconds, 1)}
            for name, t in tallies.items()]
    broken = [name for name, t in tallies.items() if not t.ok()]
    refusals = [f"{name}'s first refusal of a task another method planned: {t.first_refusal}"
                for name, t in tallies.items() if t.first_refusal]
    return harness.Outcome(rows, notes=[f"{covered} tasks (seed {settings.seed}), 1-{settings.max_tables} tables, "
                                f"1-{settings.max_devices} devices, memory slack 1.0-3.0 over the feasibility floor"
                                + source, *refusals],
                   failed=f"property broken for {', '.join(broken)}" if broken else None)


harness.register(harness.Experiment(
    name="memory_property",
    title="Memory safety: random tasks, plans checked by independent arithmetic",
    settings=MemoryPropertySettings,
    run=run,
    # quick: the unit test's sample, which already reaches every method's plans and refusals
    suites={"quick": (harness.SuiteRun({"tasks": 12, "seed": 3, "max_tables": 40, "max_devices": 16}),),
            "claims": (harness.SuiteRun({"merge": True}),)},
))
