"""How fast the command answers: `shardwise --help`, `plan --help` and a mistaken `plan` command line next to
`python -c pass` (none of them imports torch, MLflow or kfp), and `shardwise plan` of a 100-table task with a model
directory next to the same plan with the registered champion, `models:/shardwise-cost-<kind>@champion`:
warm (which version the alias names and that version's files both in the local cache: no MLflow), after a write to
the store (MLflow's client asked which version; its files cached) and cold (an empty cache: MLflow downloads).

The champion is a small cost model trained on synthetic costs (tests/unit/costmodel_synthetic.py), registered in a
temporary sqlite store. The commands take turns run by run, so a machine that drifts in speed slows them alike;
each row is a median of wall seconds and of CPU seconds (user + system, which moves less when others share the
machine), and whether the command imported torch or MLflow (checked once, untimed).

    python -m benchmarks cli_startup [--repeats 9] [--plan-repeats 5] [--record]
"""

from __future__ import annotations

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

from pydantic import Field

from benchmarks.harness import Context, Experiment, ExperimentSettings, Outcome, register, test_helpers

#: run a shardwise command line in-process, then say which heavy libraries it imported
_IMPORTS = ("import sys\nfrom shardwise.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'mlflow' in sys.modules)")


class CliStartupSettings(ExperimentSettings):
    """How many runs of each command."""

    repeats: int = Field(default=9, ge=1, description="runs of each command that imports no torch")
    plan_repeats: int = Field(default=5, ge=1, description="runs of each torch-loading command")


def _run_s(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of `argv` (a usage mistake's exit 2 counts as answered)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 2):
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode()[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _medians_s(commands: dict[str, list[str]], repeats: int, env: dict[str, str],
               before: dict[str, Callable[[], None]]) -> dict[str, tuple[float, float]]:
    """Each command's median wall and CPU seconds, the commands taking turns; `before[name]()` runs untimed first."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, argv in commands.items():
            before.get(name, lambda: None)()
            times[name].append(_run_s(argv, env))
    return {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for name, t in times.items()}


def _champion(tmp: Path) -> tuple[str, Path]:
    """A small cost model of this machine's kind: registered as champion in a sqlite store in `tmp`, and saved."""
    import pandas as pd

    from shardwise.costmodel import TrainConfig, train_cost_model
    from shardwise.integrations.mlflow import MlflowService
    from shardwise.profiling import hardware_kind

    synthetic = test_helpers("costmodel_synthetic")
    here = hardware_kind("cpu")
    frame = pd.concat([synthetic.cost_frame({"a": synthetic.synthetic_tables("a", 12, 0)}, {"a": 60}, 0,
                                            hardware_kind=here),
                       synthetic.comm_rows(10, 0, hardware_kind=here)], ignore_index=True)
    model, report = train_cost_model(frame, 0, TrainConfig(epochs=5, comm_epochs=5, progress=False))
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    cwd = os.getcwd()
    os.chdir(tmp)  # MLflow's default artifact root (./mlruns) is relative to the working directory
    try:
        MlflowService(store).log_cost_model(model, report)
    finally:
        os.chdir(cwd)
    return store, model.save(tmp / "model")


def run(settings: CliStartupSettings, context: Context) -> Outcome:
    """Each command's median wall and CPU seconds and what it imported; plans against the model directory's."""
    from shardwise.integrations.mlflow_registry import STILL_S
    from shardwise.workload import ShardingTask, TableSpec, save_task

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        tables = [TableSpec(name=f"t{i}", rows=1000 + 37 * i, dim=16 * (1 + i % 4), pooling_factor=1.0 + i % 7)
                  for i in range(100)]
        task = str(save_task(ShardingTask(num_devices=8, device_memory_bytes=2**30, batch_size=512,
                                          tables=tuple(tables)), tmp / "task.json"))
        store, model_dir = _champion(tmp)
        db, cache = tmp / "mlflow.db", tmp / "cache"
        env = {**os.environ, "SHARDWISE_CACHE": str(cache)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as on a user's machine
        cli = [sys.executable, "-m", "shardwise.cli"]
        plan = ["plan", "--task", task, "--device", "cpu", "--out", str(tmp / "plan.json")]
        quick = {"python -c pass": [sys.executable, "-c", "pass"], "shardwise --help": [*cli, "--help"],
                 "shardwise task check": [*cli, "task", "check", task], "shardwise plan --help": [*cli, "plan", "--help"],
                 "shardwise plan --method nope (a mistake)": [*cli, *plan, "--method", "nope"]}
        slow = {"python -c 'import torch'": [sys.executable, "-c", "import torch"],
                "plan, model directory": [*cli, *plan, "--model", str(model_dir)],
                "plan, champion, warm cache": [*cli, *plan, "--tracking-uri", store],
                "plan, champion, store written since": [*cli, *plan, "--tracking-uri", store],
                "plan, champion, cold cache": [*cli, *plan, "--tracking-uri", store]}
        still = time.time() - 10 * STILL_S  # the store's file as last written long ago: its answer is kept
        os.utime(db, (still, still))
        for argv in (slow["plan, champion, warm cache"], quick["shardwise --help"]):
            _run_s(argv, env)  # untimed: the cache filled, the bytecode written

        def cold() -> None:
            os.utime(db, (still, still))
            shutil.rmtree(cache, ignore_errors=True)

        before = {"plan, champion, warm cache": lambda: os.utime(db, (still, still)),
                  "plan, champion, store written since": lambda: os.utime(db, None), "plan, champion, cold cache": cold}
        medians = _medians_s(quick, settings.repeats, env, before) | _medians_s(slow, settings.plan_repeats, env,
                                                                                  before)
        imports = {}
        for name, argv in {**quick, **slow}.items():
            if argv[:3] == cli:
                before.get(name, lambda: None)()
                done = subprocess.run([sys.executable, "-c", _IMPORTS, *argv[3:]], capture_output=True, text=True,
                                      env=env)
                imports[name] = done.stdout.split()[-2:]
    local_s = medians["plan, model directory"][0]
    rows = [{"command": name, "median_s": round(s, 3), "cpu_s": round(cpu, 3),
             "over_model_directory_s": round(s - local_s, 3) if name.startswith("plan, champion") else None,
             "imports_torch": imports[name][0] == "True" if name in imports else None,
             "imports_mlflow": imports[name][1] == "True" if name in imports else None}
            for name, (s, cpu) in medians.items()]
    return Outcome(rows, notes=[
        f"median of {settings.repeats} runs each ({settings.plan_repeats} for the commands that load torch), taking "
        f"turns; 100 tables on 8 devices, neuroshard; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after (others' jobs too)"])


register(Experiment(
    name="cli_startup",
    title="CLI start-up and `plan` with the registered champion",
    settings=CliStartupSettings,
    run=run,
    threads=None,
))
