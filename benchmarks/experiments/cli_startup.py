"""How fast the command answers: `shardwise --help` and `shardwise task check` next to `python -c pass`, and
`shardwise plan` with the registered champion next to `python -c "import torch"`.

`--help` and `task check` import neither torch, mlflow nor kfp (the verb's module loads only when it runs). `plan`
needs torch; with the champion's files in the local cache (warm: every plan after the first of a version) it
should import nothing else heavy: the alias is read from the sqlite store with the standard library, no MLflow.
Cold: an empty cache each run, so MLflow downloads the version. The task has 100 tables on 8 devices; the
champion is a small cost model trained on synthetic costs (tests/unit/costmodel_synthetic.py) and registered in a
temporary sqlite store. The drop-in: `ShardwisePlanner(tracking_uri=store, adapt=0).plan(module)` of the
26-table MLPerf DLRM-DCNv2 model (benchmarks/dropin.py), champion resolved from the cache, next to
TorchRec's `EmbeddingShardingPlanner` on the same tables, both the first call in a fresh process (adapt=0: that
small champion never saw dim-128 tables, and adapting it, kernels timed for up to 120 s, is not planning).

Python caches the bytecode of what it imports (__pycache__), as it does on a user's machine: where the
environment says PYTHONDONTWRITEBYTECODE (this project's sandboxes do), shardwise's own modules, which an
editable install does not precompile, are compiled again on every run (about 0.07 CPU s here) while torch's
come precompiled from its wheel. The timed commands run without it, after one untimed run that writes the cache;
the warm-cache plan is also timed with it, in its own row.

Timed with a CPU-bound process beside the benchmark, as on a laptop with a browser open, the commands taking turns
run by run; the figures to read are the ratio to `python -c pass` and the seconds over `python -c "import torch"`,
in wall time and in CPU time (user + system of the process, which moves less when others share the machine).

    python -m benchmarks cli_startup [--repeats 15] [--plan-repeats 5] [--no-load] [--record]
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks.harness import TEST_HELPERS, Context, Experiment, ExperimentSettings, Outcome, register
from shardwise.workload import ShardingTask, TableSpec, save_task

ROOT = Path(__file__).resolve().parents[2]
#: the drop-in timed in a fresh process: first plan with the registered champion, then TorchRec's planner
_DROPIN = """
import json, sys
sys.path.insert(0, sys.argv[2])
from benchmarks.dropin import dcnv2_module, plan_both
from shardwise.integrations.torchrec import ShardwisePlanner
from shardwise.search import make_searcher
from shardwise.workload import mlperf_dcnv2_tables, shard_memory_bytes

module, constraints = dcnv2_module(0.001)  # a step of 2048 samples: 512 per rank (TorchRec's batch_size)
memory = int(1.5 * shard_memory_bytes(list(mlperf_dcnv2_tables(0.001)), 2048) / 4)
planner = ShardwisePlanner(world_size=4, batch_size=2048 // 4, constraints=constraints, device_type="cpu",
                           device_memory_bytes=memory, storage_reservation=0.0, tracking_uri=sys.argv[1], adapt=0)
_, _, theirs, ours_s, theirs_s, _, _ = plan_both(planner, module, make_searcher("torchrec"))
print(json.dumps({"ours_s": ours_s, "theirs_s": theirs_s, "mlflow": "mlflow" in sys.modules}))
"""


def _busy(stop: Any) -> None:  # a multiprocessing Event
    x = 0
    while not stop.is_set():
        x = (x * 31 + 7) % 1_000_003


def _run_s(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of `argv` (which must succeed). On a shared machine
    the CPU seconds move less with the load around than the wall seconds do."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode()[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _medians_s(commands: dict[str, list[str]], repeats: int, env: dict[str, str] | None = None,
               before: dict[str, Callable[[], None]] | None = None) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each command, the commands taking turns run by run (a machine that drifts
    in speed slows them alike); `before[name]()` runs untimed before each run of `name` (emptying a cache)."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, argv in commands.items():
            if before and name in before:
                before[name]()
            times[name].append(_run_s(argv, env))
    return {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in times.items()}


def _register_champion(tmp: Path) -> str:
    """A small cost model for this machine's hardware kind, registered as champion in a sqlite store in `tmp`."""
    sys.path.insert(0, str(TEST_HELPERS))  # the synthetic cost data
    import pandas as pd
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model
    from shardwise.integrations.mlflow import MlflowService
    from shardwise.profiling import hardware_kind

    frame = pd.concat([cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0), comm_rows(10, 0)],
                      ignore_index=True)
    frame["hardware_kind"] = hardware_kind("cpu")
    model, report = train_cost_model(frame, 0, TrainConfig(epochs=5, comm_epochs=5, progress=False))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cwd = os.getcwd()
    os.chdir(tmp)  # MLflow's default artifact root (./mlruns) is relative to the working directory
    try:
        MlflowService(uri).log_cost_model(model, report)
    finally:
        os.chdir(cwd)
    return uri


def _dropin_s(store: str, env: dict[str, str], repeats: int) -> tuple[float, float]:
    """Medians of the drop-in's and TorchRec's planner's first plan in a fresh process (warm cache)."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", _DROPIN, store, str(ROOT)], capture_output=True,
                              text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"drop-in timing failed: {done.stderr[-2000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if any(r["mlflow"] for r in runs[1:]):
        raise RuntimeError("the drop-in imported MLflow with the champion in the cache")
    return statistics.median(r["ours_s"] for r in runs), statistics.median(r["theirs_s"] for r in runs)


class CliStartupSettings(ExperimentSettings):
    """How many runs of each command, and whether a busy process runs beside them."""

    repeats: int = Field(default=15, ge=1)
    plan_repeats: int = Field(default=5, ge=1, description="runs of each torch-loading command")
    no_load: bool = Field(default=False, description="no CPU-bound process beside the benchmark")


def run(args: CliStartupSettings, context: Context) -> Outcome:
    """Each command's median wall and CPU seconds, the drop-in's first plan beside TorchRec's planner's."""

    load_before = os.getloadavg()[0]  # the machine's 1-minute load: others' work shares it
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tables = [TableSpec(name=f"t{i}", rows=1000, dim=16, pooling_factor=4.0) for i in range(8)]
        task = save_task(ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512, tables=tables),
                         tmp / "task.json")
        big = [TableSpec(name=f"t{i}", rows=1000 + 37 * i, dim=16 * (1 + i % 4), pooling_factor=1.0 + i % 7)
               for i in range(100)]
        task100 = save_task(ShardingTask(num_devices=8, device_memory_bytes=2**30, batch_size=512, tables=big),
                            tmp / "task100.json")
        store = _register_champion(tmp)
        cache = tmp / "cache"
        env = {**os.environ, "SHARDWISE_CACHE": str(cache)}
        no_bytecode_cache = env.pop("PYTHONDONTWRITEBYTECODE", None)  # see the module docstring
        shardwise = [sys.executable, "-m", "shardwise.cli"]
        plan = [*shardwise, "plan", "--task", str(task100), "--device", "cpu", "--tracking-uri", store,
                "--out", str(tmp / "plan.json")]
        quick = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "shardwise --help": [*shardwise, "--help"],
            "shardwise task check": [*shardwise, "task", "check", str(task)],
        }
        stop = mp.Event()
        load = None if args.no_load else mp.Process(target=_busy, args=(stop,), daemon=True)
        if load:
            load.start()
        try:
            _run_s(plan, env)  # untimed: writes the bytecode cache and the registry cache
            medians = _medians_s(quick, args.repeats, env)
            slow = {
                "python -c 'import torch'": [sys.executable, "-c", "import torch"],
                "shardwise plan --help (loads torch)": [*shardwise, "plan", "--help"],
                "shardwise plan, 100 tables, champion, cold cache": plan,
                "shardwise plan, 100 tables, champion, warm cache": plan,
            }
            if no_bytecode_cache:
                slow["shardwise plan, warm cache, PYTHONDONTWRITEBYTECODE=1"] = [
                    "env", f"PYTHONDONTWRITEBYTECODE={no_bytecode_cache}", *plan]
            # the cold run empties the cache first; the warm run after it finds the version there
            medians |= _medians_s(slow, args.plan_repeats, env,
                                  {"shardwise plan, 100 tables, champion, cold cache": lambda: shutil.rmtree(cache, True)})
            ours_s, theirs_s = _dropin_s(store, env, args.plan_repeats)
        finally:
            stop.set()
    (base, _), (torch_s, torch_cpu_s) = medians["python -c pass"], medians["python -c 'import torch'"]
    rows = [{"command": name, "median_s": round(s, 3), "cpu_s": round(cpu, 3), "ratio_to_python": round(s / base, 2),
             "over_import_torch_s": round(s - torch_s, 3) if "plan" in name else None,
             "over_import_torch_cpu_s": round(cpu - torch_cpu_s, 3) if "plan" in name else None,
             "ratio_to_torchrec_planner": None} for name, (s, cpu) in medians.items()]
    empty = {"cpu_s": None, "ratio_to_python": None, "over_import_torch_s": None, "over_import_torch_cpu_s": None}
    rows.append({"command": "ShardwisePlanner.plan, DLRM-DCNv2, champion, warm cache", "median_s": round(ours_s, 3),
                 **empty, "ratio_to_torchrec_planner": round(ours_s / theirs_s, 2)})
    rows.append({"command": "TorchRec EmbeddingShardingPlanner.plan, DLRM-DCNv2", "median_s": round(theirs_s, 3),
                 **empty, "ratio_to_torchrec_planner": 1.0})
    load_note = "no other load" if args.no_load else "one CPU-bound process beside it"
    load_note += "; bytecode cached (PYTHONDONTWRITEBYTECODE unset for the timed commands)"
    load_note += f"; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (others' jobs too)"
    return Outcome(rows, notes=[
        f"median of {args.repeats} runs each ({args.plan_repeats} for the commands that load torch and the drop-in), "
        f"{load_note}; the drop-in: 26-table DLRM-DCNv2, 4 ranks, champion from the cache, first call in a fresh "
        "process"])


register(Experiment(
    name="cli_startup",
    title="CLI start-up and `plan` with the registered champion",
    settings=CliStartupSettings,
    run=run,
    threads=None,
))
