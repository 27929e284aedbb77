"""Faults injected into real runs, for tests/faults and `python -m benchmarks faults`: each function runs one try of
one fault (real processes: `shardwise` verbs, an `mlflow server`, moto's S3 server on loopback) and returns what
it cost: rows lost, rows stored twice, champions that are wrong or point at a half-logged version, and the seconds
from the fault to the tool's error."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service_processes import MlflowProcess

#: `shardwise` in a child process (the console script may not be on PATH)
CLI = [sys.executable, "-c", "import sys; from shardwise.cli import main; sys.exit(main(sys.argv[1:]))"]
BUCKET = "shardwise-costs"
SECRET = "s3cr3t-key-value"


@dataclass
class FaultOutcome:
    """One try of one fault: what the tool said, and what it lost, stored twice or left wrong."""

    fault: str
    rows_lost: int = 0
    duplicated_rows: int = 0
    wrong_champions: int = 0
    seconds_to_error: float | None = None
    error: str = ""  # the tool's error line
    notes: dict[str, object] = field(default_factory=dict)
    # pipeline_killed: the cost rows the steps finished before the kill had stored (pipeline_costs), read at the kill
    rows_at_kill: Counter[tuple[str, str, int, int]] | None = None


def _wait_for(condition: Callable[[], bool], timeout_s: float, every_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every_s)
    return False


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if ": error: " in line]
    return lines[-1] if lines else stderr.strip().splitlines()[-1] if stderr.strip() else ""


# -- the object store stopped while `profile --out s3://...` writes ---------------------------------------------


def _tables_file(tmp: Path) -> Path:
    from shardwise.workload import TableSpec

    # enough tables that sampled shards hardly ever repeat a config (a repeated config is measured twice)
    tables = [TableSpec(name=f"t{i}", rows=200 + 37 * i, dim=8 * (1 + i % 4), pooling_factor=1.0 + i % 5)
              for i in range(40)]
    path = tmp / "tables.json"
    path.write_text(json.dumps({"format": "shardwise.tables/v1", "batch_size": 64,
                                "tables": [t.model_dump(mode="json") for t in tables]}))
    return path


_PROGRESS = re.compile(r"(\d+)/(\d+) \[")  # tqdm's "profile:  80%|...| 48/60 [00:05<..."


def profile_store_stopped(tmp: Path, *, num_shards: int = 60, stop_before_row: int = 50) -> FaultOutcome:
    """moto's S3 server stopped while a `profile --out s3://...` run measures, a few shards before it writes its
    part of rows up to `stop_before_row` (a part per 25 rows), started again on the same port, and the same
    command rerun. Rows lost: (config_id, repeat) of a fault-free run of the command missing after the rerun, or
    safe when the store stopped and gone after; duplicated: stored more often than the fault-free run stores
    them. Seconds to the error: from the stop to the exit (a few shards' measuring, then the failed write)."""
    import boto3
    from moto.server import ThreadedMotoServer

    tmp.mkdir(parents=True, exist_ok=True)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key=SECRET,
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    # moto keeps its objects for the whole process: each try its own prefix
    prefix = f"s3://{BUCKET}/costs/{tmp.name.lower().replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    args = ["profile", "--tables", str(_tables_file(tmp)), "--num-shards", str(num_shards), "--max-tables", "3",
            "--timing-iters", "3", "--warmup-iters", "1", "--seed", "0", "--device", "cpu"]
    argv = [*CLI, *args, "--out", prefix]
    outcome = FaultOutcome("object store stopped during profile --out s3://")
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stopped_at: list[float] = []
        stderr: list[str] = []

        def stop_before_the_write() -> None:  # reads the progress bar as it draws
            assert proc.stderr is not None
            seen = ""
            while chunk := proc.stderr.read(1):
                seen += chunk
                if chunk in "\r\n":
                    counts = _PROGRESS.findall(seen[-200:])
                    if not stopped_at and counts and int(counts[-1][0]) >= stop_before_row - 5:
                        moto.stop()  # the store goes away between two writes
                        stopped_at.append(time.monotonic())
            stderr.append(seen)

        reader = threading.Thread(target=stop_before_the_write, daemon=True)
        reader.start()
        proc.wait(timeout=900)
        exited_at = time.monotonic()
        reader.join(30)
        outcome.error = _error_line("".join(stderr))
        outcome.notes["first_exit"] = proc.returncode
        if not stopped_at:
            raise RuntimeError(f"the store was never stopped: {''.join(stderr)[-1000:]}")
        outcome.seconds_to_error = exited_at - stopped_at[0]
        moto = ThreadedMotoServer(ip_address=host, port=port)  # the same store comes back (moto keeps its objects)
        moto.start()
        safe = _keys(_s3_rows(prefix, env))  # what the store holds once it is back
        outcome.notes["rows_when_stopped"] = len(safe)
        rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        outcome.notes["rerun_exit"] = rerun.returncode
        # the summary's line of what was measured and what was already stored (a rate line may follow it)
        outcome.notes["rerun"] = next((line for line in rerun.stdout.splitlines() if "already stored" in line),
                                      rerun.stderr[-300:])
        keys = Counter(_keys(_s3_rows(prefix, env)))
        # the same command without a fault, into a local dataset: what the run measures
        clean = subprocess.run([*CLI, *args, "--out", str(tmp / "fault-free")], env=env, capture_output=True,
                               text=True, timeout=900)
        if clean.returncode != 0:
            raise RuntimeError(f"the fault-free profile failed: {clean.stderr[-1000:]}")
        from shardwise.profiling.dataset import load_costs

        expected = Counter(_keys(load_costs(tmp / "fault-free")))
        outcome.duplicated_rows = sum((keys - expected).values())
        outcome.rows_lost = sum((expected - keys).values()) + len(set(safe) - set(keys))
        outcome.notes["rows"] = sum(keys.values())
        return outcome
    finally:
        moto.stop()


def _keys(rows) -> list[tuple[str, int]]:  # noqa: ANN001 - a DataFrame, or None for no rows at all
    return [] if rows is None else list(zip(rows["config_id"].astype(str), rows["repeat"].astype(int), strict=True))


def _s3_rows(prefix: str, env: dict[str, str]):  # noqa: ANN202 - a DataFrame; pandas loads only here
    """The dataset at `prefix` as the loader reads it, in this process with the child's AWS variables."""
    from shardwise.profiling.dataset import load_stored

    saved = {k: os.environ.get(k) for k in env if k.startswith("AWS_")}
    os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
    try:
        return load_stored(prefix)  # None where no part was written yet
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- the tracking server SIGKILLed while `pretrain` / `train-policy` registers ------------------------------------

HARDWARE_KIND = "cpu-fault"


def _kind(tmp: Path) -> str:
    """A hardware kind of this try's own, for a registry that tries share (its models' and policies' names)."""
    return f"{HARDWARE_KIND}-{re.sub('[^a-z0-9]+', '-', tmp.name.lower())}"[:60]


def _cost_data(tmp: Path, kind: str = HARDWARE_KIND) -> Path:
    """A small cost dataset with the real columns (the synthetic law of costmodel_synthetic) for this fault's kind."""
    import pandas as pd
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.profiling.dataset import write_part

    frame = pd.concat([cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0, hardware_kind=kind),
                       comm_rows(10, 0, hardware_kind=kind)], ignore_index=True)
    path = tmp / "costs"
    write_part(path, frame.astype(object).where(frame.notna(), None).to_dict("records"))
    return path


def _verb_argv(verb: str, tmp: Path, data: Path, url: str, seed: int) -> list[str]:
    if verb == "pretrain":
        return [*CLI, "pretrain", "--data", str(data), "--out", str(tmp / f"model-{seed}"), "--epochs", "2",
                "--seed", str(seed), "--tracking-uri", url]
    return [*CLI, "train-policy", "--method", "dreamshard", "--model", str(tmp / "model-0"), "--tables",
            str(_tables_file(tmp)), "--out",
            str(tmp / f"policy-{seed}"), "--num-tasks", "2", "--validation-tasks", "2", "--min-tables", "4",
            "--max-tables", "6", "--num-devices", "2", "--episodes", "2", "--seed", str(seed), "--tracking-uri", url]


def _registry(db: Path, name: str) -> tuple[int, dict[str, str], dict[str, dict[str, str]]]:
    """(versions of `name`, alias -> version, version -> its tags) read from the server's sqlite store."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
        versions = con.execute("SELECT COUNT(*) FROM model_versions WHERE name = ?", (name,)).fetchone()[0]
        aliases = dict(con.execute("SELECT alias, version FROM registered_model_aliases WHERE name = ?", (name,)))
        tags: dict[str, dict[str, str]] = {}
        for version, key, value in con.execute("SELECT version, key, value FROM model_version_tags WHERE name = ?",
                                               (name,)):
            tags.setdefault(str(version), {})[key] = value
    return int(versions), {k: str(v) for k, v in aliases.items()}, tags


def _versions(db: Path, name: str) -> int:
    try:
        return _registry(db, name)[0]
    except sqlite3.Error:  # the server is writing, or has not made the table yet
        return -1


@contextlib.contextmanager
def _registry_for(tmp: Path, server: MlflowProcess | None) -> Iterator[tuple[MlflowProcess, str]]:
    """(the registry, the hardware kind to register under) for one try: `server` shared between tries (started if
    it is down, left running; a kind of this try's own), or one started for this try and stopped after."""
    from service_processes import MlflowProcess

    if server is not None:
        if server.proc is None:
            server.start()
        yield server, _kind(tmp)
        return
    (tmp / "server").mkdir(exist_ok=True)
    own = MlflowProcess(tmp / "server")
    own.start()
    try:
        yield own, HARDWARE_KIND
    finally:
        own.kill()


def _main_here(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """`argv` (a `CLI` command line) in this process with `env`'s model cache: its exit status and output. A run that
    needs no fresh interpreter (a child imports torch and MLflow again, seconds on 2 cores)."""
    from shardwise.cli import main

    assert argv[: len(CLI)] == CLI, argv
    output = io.StringIO()
    saved = os.environ.get("SHARDWISE_CACHE")
    os.environ["SHARDWISE_CACHE"] = env["SHARDWISE_CACHE"]
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            code = main(argv[len(CLI):])
    finally:
        if saved is None:
            os.environ.pop("SHARDWISE_CACHE", None)
        else:
            os.environ["SHARDWISE_CACHE"] = saved
    return code, output.getvalue()


def _run_here(argv: list[str], env: dict[str, str], what: str) -> None:
    """`_main_here`, its output kept unless it fails."""
    code, output = _main_here(argv, env)
    if code != 0:
        raise RuntimeError(f"{what} failed: exit {code}: {output[-1500:]}")


def _kill_once_registered(proc: subprocess.Popen[str], server: MlflowProcess, name: str, before_versions: int,
                          delay_s: float, outcome: FaultOutcome) -> tuple[bool, bool]:
    """SIGKILL the tracking server `delay_s` after `proc`'s new version of `name` appears in its store (its gate
    runs then), wait for `proc`, note its exit and error line, and start the server again with its store:
    (whether `proc` was still running at the kill, whether it failed)."""
    registered = _wait_for(lambda: proc.poll() is not None or _versions(server.db, name) > before_versions, 600, 0.01)
    if not registered or proc.poll() is not None:
        proc.communicate()
        raise RuntimeError(f"{name}: the registering run ended before its version appeared: exit {proc.returncode}")
    time.sleep(delay_s)
    killed = proc.poll() is None
    server.kill()
    killed_at = time.monotonic()
    _, stderr = proc.communicate(timeout=600)
    failed = proc.returncode != 0
    outcome.seconds_to_error = time.monotonic() - killed_at if killed and failed else None
    outcome.error = _error_line(stderr) if failed else ""
    outcome.notes.update(first_exit=proc.returncode, killed_while_running=killed,
                         traceback="Traceback (most recent call last)" in stderr,
                         error_lines=sum(": error: " in line for line in stderr.splitlines()))
    server.start()  # the service comes back with its store
    return killed, failed


def registration_server_killed(tmp: Path, *, verb: str = "pretrain", delay_s: float = 0.0,
                               server: MlflowProcess | None = None) -> FaultOutcome:
    """The MLflow tracking server SIGKILLed `delay_s` after `verb`'s new model version appears in its store (the
    gate runs then: the champion's comparison, the alias, the evidence), started again, and `verb` rerun.
    `server`: a registry shared between tries (each registers under a hardware kind of its own, and leaves it
    running); by default one is started for this try and stopped after.

    Wrong champions: after the kill, an alias that moved off the champion before it, or points at a version without
    the gate's evidence or whose files do not load; after the rerun, the same, or no alias on the new version."""

    from shardwise.integrations.mlflow import (
        CHAMPION,
        MlflowService,
        champion_uri,
        cost_model_name,
        policy_name,
    )

    tmp.mkdir(parents=True, exist_ok=True)
    outcome = FaultOutcome(f"tracking server killed during {verb} registration")
    with _registry_for(tmp, server) as (server, kind):
        name = cost_model_name(kind) if verb == "pretrain" else policy_name("dreamshard", kind)
        url = server.url
        data = _cost_data(tmp, kind)
        env = {**os.environ, "SHARDWISE_CACHE": str(tmp / "cache")}
        # the runs before the fault in this process: the one it kills and the rerun are fresh processes
        if verb == "train-policy":  # the cost model it trains against
            _run_here([*_verb_argv("pretrain", tmp, data, url, 0), "--no-register"], env, "the cost model's pretrain")
        _run_here(_verb_argv(verb, tmp, data, url, 0), env, f"the first {verb}")
        before_versions, before_aliases, _ = _registry(server.db, name)
        champion_before = before_aliases[CHAMPION]

        proc = subprocess.Popen(_verb_argv(verb, tmp, data, url, 1), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        killed, failed = _kill_once_registered(proc, server, name, before_versions, delay_s, outcome)
        _, aliases, tags = _registry(server.db, name)
        if killed and not failed:
            # the process was still up, but its registration had ended before the kill reached it: that is only
            # right where the new version is whole (the gate's decision on it and its alias moved), else the
            # fault was swallowed and the run exited 0 on a half-done registration
            new = str(before_versions + 1)
            decision = tags.get(new, {}).get("gate.decision")
            outcome.notes["registered_before_the_kill"] = decision is not None and aliases.get(decision) == new
            outcome.wrong_champions += not outcome.notes["registered_before_the_kill"]
        outcome.wrong_champions += _half_logged_aliases(aliases, tags)
        outcome.wrong_champions += aliases.get(CHAMPION) not in (champion_before, str(before_versions + 1))
        outcome.notes["champion_after_kill"] = aliases.get(CHAMPION)

        rerun = subprocess.run(_verb_argv(verb, tmp, data, url, 1), env=env, capture_output=True, text=True,
                               timeout=900)
        outcome.notes["rerun_exit"] = rerun.returncode
        if rerun.returncode != 0:
            outcome.notes["rerun_error"] = _error_line(rerun.stderr)
        versions, aliases, tags = _registry(server.db, name)
        outcome.wrong_champions += _half_logged_aliases(aliases, tags)
        newest = str(versions)
        if rerun.returncode != 0 or tags.get(newest, {}).get("gate.decision") not in aliases or \
                aliases.get(tags.get(newest, {}).get("gate.decision", "")) != newest:
            outcome.wrong_champions += 1  # the rerun did not finish the job: its version holds no alias
        outcome.notes["champion_after_rerun"] = aliases.get(CHAMPION)
        try:  # the champion loads
            MlflowService(url).load(champion_uri(name), lambda d: sorted(p.name for p in d.iterdir()))
        except Exception as err:  # noqa: BLE001 - any failure to load is a dangling champion
            outcome.wrong_champions += 1
            outcome.notes["champion_load"] = str(err)[:300]
        return outcome


def _half_logged_aliases(aliases: dict[str, str], tags: dict[str, dict[str, str]]) -> int:
    """Aliases on a version that lacks the gate's decision for that alias: the gate did not finish on it (its
    evidence is written before the alias moves), so the alias points at a half-logged version."""
    return sum(tags.get(version, {}).get("gate.decision") != alias for alias, version in aliases.items())


# -- two runs registering to one registry at the same time --------------------------------------------------------

#: the start of a registering run: its arguments (the registry, what it registers and under which name, the metric
#: it registers with, the start-time file `go` ("-": start at once) and `offset_s` after it, and `compare_s`, what
#: the gate's comparison with the champion takes, finding the champion's own metric), past its imports
_GATE_RUN = """
import os, sys, time
from pathlib import Path
from mlflow import MlflowClient
from shardwise.integrations.mlflow import MlflowService
url, what, name, value, go, offset_s, compare_s = sys.argv[1:8]
client = MlflowClient(url)

def champion_value(uri):
    registered, version = uri.removeprefix("models:/").split("/")
    time.sleep(float(compare_s))
    return float(client.get_model_version(registered, version).tags["gate.value"])

if go != "-":
    Path(go + f".ready-{os.getpid()}").touch()  # past its imports: the caller sets the start time once all are
    while not Path(go).exists():
        time.sleep(0.005)
    time.sleep(max(0.0, float(Path(go).read_text()) + float(offset_s) - time.time()))
"""

#: one run logging a policy (`what`, under hardware kind `name`) with a known validation cost (`value`)
_REGISTER = _GATE_RUN + """
promotion = MlflowService(url).log_policy(Path(what), method="dreamshard", hardware_kind=name, history=[],
                                          params={}, validation_cost=float(value), champion_value=champion_value).promotion
print(promotion.version, promotion.alias, promotion.reason)
"""


def _policy_dir(root: Path) -> Path:
    import torch

    root.mkdir(parents=True, exist_ok=True)
    (root / "policy.json").write_text(json.dumps({"format": "shardwise.policy/v1", "method": "dreamshard"}))
    torch.save({"w": torch.ones(2)}, root / "weights.pt")
    return root


def _run_together(argvs: list[list[str]], go: Path, outcome: FaultOutcome) -> None:
    """Start each registering run, give them one start time once all are past their imports (`go` holds it), wait
    for them, keep each exit and last line in `outcome.notes["runs"]`; a run that failed is raised."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    ready = [Path(f"{go}.ready-{p.pid}") for p in procs]
    _wait_for(lambda: all(r.exists() for r in ready) or any(p.poll() is not None for p in procs), 600, 0.01)
    go.with_suffix(".tmp").write_text(str(time.time() + 0.2))
    go.with_suffix(".tmp").rename(go)  # whole when a run reads it
    results = [p.communicate(timeout=600) for p in procs]
    outcome.notes["runs"] = [(p.returncode, out.strip() or _error_line(err)) for p, (out, err) in
                             zip(procs, results, strict=True)]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"a registering run failed: {outcome.notes['runs']}")


def concurrent_registration(tmp: Path, *, costs: tuple[float, float] = (5.0, 3.0),
                            offsets_s: tuple[float, float] = (0.0, 0.0), compare_s: float = 1.0,
                            server: MlflowProcess | None = None) -> FaultOutcome:
    """Two processes register a policy to one registry (champion: cost 10) at once, the second `offsets_s` apart;
    lower cost is better. Wrong champions: the champion afterwards is not the lowest cost, or any alias points
    at a version without the gate's decision for it. `server`: a running registry to share between tries (each
    try registers its own policy name there); by default one is started for this try and stopped after."""

    from shardwise.integrations.mlflow import CHAMPION, MlflowService, policy_name

    tmp.mkdir(parents=True, exist_ok=True)
    outcome = FaultOutcome("two runs registering to one registry at once")
    with _registry_for(tmp, server) as (server, kind):
        name = policy_name("dreamshard", kind)
        url = server.url
        policy = _policy_dir(tmp / "policy")
        MlflowService(url).log_policy(policy, method="dreamshard", hardware_kind=kind, history=[], params={},
                                      validation_cost=10.0)
        go = tmp / "go"
        _run_together([[sys.executable, "-c", _REGISTER, url, str(policy), kind, str(cost), str(go), str(offset),
                        str(compare_s)] for cost, offset in zip(costs, offsets_s, strict=True)], go, outcome)
        _, aliases, tags = _registry(server.db, name)
        champion = aliases.get(CHAMPION, "")
        outcome.notes["champion_cost"] = tags.get(champion, {}).get("gate.value")
        outcome.wrong_champions = int(float(tags.get(champion, {}).get("gate.value", "nan")) != min(costs))
        outcome.wrong_champions += _half_logged_aliases(aliases, tags)
        return outcome


# -- the plan registry: a plan's registration killed, and two at once ---------------------------------------------

#: one run registering a production task's plan (`plan_registry.register_plan`, what `shardwise publish` calls after
#: measuring: the files `what`, of task `name`) that measured `value` ms
_REGISTER_PLAN = _GATE_RUN + """
from shardwise.errors import ShardwiseError
from shardwise.integrations.plan_registry import register_plan
try:
    promotion = register_plan(MlflowService(url), name, Path(what), measured_ms=float(value),
                              champion_ms=champion_value, min_gain=0.0, tags={}, params={},
                              metrics={"plan_ms": float(value)})
except ShardwiseError as err:  # as `shardwise publish` says it: one line, exit 2
    print(f"shardwise publish: error: {err}", file=sys.stderr)
    sys.exit(2)
print(promotion.version, promotion.alias, promotion.reason)
"""


def _plan_files(tmp: Path) -> Path:
    """A registered plan's files (a two-table task planned table-wise on two devices)."""
    from shardwise.integrations.plan_registry import write_plan_files
    from shardwise.search import Plan, Shard
    from shardwise.workload import ShardingTask, TableSpec, save_task

    tmp.mkdir(parents=True, exist_ok=True)
    task = save_task(ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512, tables=(
        TableSpec(name="a", rows=1000, dim=8, pooling_factor=1.0), TableSpec(name="b", rows=500, dim=8,
                                                                              pooling_factor=2.0))), tmp / "task.json")
    plan = Plan(num_devices=2, shards=(Shard(table="a", col_offset=0, dim=8, device=0),
                                       Shard(table="b", col_offset=0, dim=8, device=1)), method="faults")
    return write_plan_files(tmp / "files", plan, task, {"plan_ms": 1.0}, None)


def _plan_champion(url: str, kind: str, files: Path) -> tuple[str, str, str]:
    """A task of this try's own whose first plan (10 ms) is registered champion: (task, registered name, url)."""
    from shardwise.integrations.mlflow import MlflowService
    from shardwise.integrations.plan_registry import plan_name, register_plan

    task = f"faults-{kind}"
    register_plan(MlflowService(url), task, files, measured_ms=10.0, champion_ms=lambda _: None, min_gain=0.0,
                  tags={}, params={}, metrics={})
    return task, plan_name(task), url


def _register_plan_argv(url: str, files: Path, task: str, ms: float, go: str = "-", offset_s: float = 0.0,
                        compare_s: float = 0.0) -> list[str]:
    return [sys.executable, "-c", _REGISTER_PLAN, url, str(files), task, str(ms), go, str(offset_s), str(compare_s)]


def _registered_champion_loads(url: str, name: str, outcome: FaultOutcome) -> None:
    """A champion whose files do not load as a registered plan counts as a wrong champion."""
    from shardwise.integrations.mlflow import MlflowService
    from shardwise.integrations.plan_registry import load_registered_plan

    try:
        load_registered_plan(f"models:/{name}@champion", service=MlflowService(url))
    except Exception as err:  # noqa: BLE001 - any failure to load is a dangling champion
        outcome.wrong_champions += 1
        outcome.notes["champion_load"] = str(err)[:300]


@functools.cache
def _publish_cost_model():  # noqa: ANN202 - a NeuralCostModel, made once per process
    """A small cost model trained here (costmodel_synthetic's law) for `shardwise publish --model`."""
    import pandas as pd
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model
    from shardwise.profiling import hardware_kind

    here = hardware_kind("cpu")
    frame = pd.concat([cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0, hardware_kind=here),
                       comm_rows(10, 0, hardware_kind=here)], ignore_index=True)
    return train_cost_model(frame, 0, TrainConfig(epochs=2, comm_epochs=2, progress=False))[0]


def publish_argv(tmp: Path, task_name: str, url: str) -> list[str]:
    """`shardwise publish` of production task `task_name` (a 4-table EmbeddingBagCollection on one CPU rank: kernels
    to measure, no all-to-all) with a small cost model, measured briefly, unrefined, registering at `url`."""
    import torch
    from torch import nn
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardwise.integrations.torchrec import export_task, save_production_task

    model = nn.Module()
    model.sparse = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=500 + 300 * i, feature_names=[f"f{i}"])
        for i in range(4)], device=torch.device("meta"))
    task = save_production_task(export_task(
        model, Topology(world_size=1, compute_device="cpu", ddr_cap=2**30), name=task_name, batch_size=32,
        constraints={f"t{i}": ParameterConstraints(pooling_factors=[1.0 + i]) for i in range(4)}),
        tmp / "production.task.json")
    cost_model = _publish_cost_model().save(tmp / "publish-model")
    return [*CLI, "publish", "--task", str(task), "--model", str(cost_model), "--tracking-uri", url, "--out",
            str(tmp / "publish"), "--refine-s", "0", "--device", "cpu", "--batch-size", "64", "--warmup-iters", "1",
            "--timing-iters", "2", "--timing-rounds", "1", "--flush-mib", "0"]


def plan_registration_server_killed(tmp: Path, *, delay_s: float = 0.0,
                                    server: MlflowProcess | None = None) -> FaultOutcome:
    """`shardwise publish` with its MLflow tracking server SIGKILLed `delay_s` after the run's new plan version
    appears in the store, the server started again, and the same publish run again. The gate runs at the kill: the
    champion before (a plan for other inputs) is not comparable, so the new version takes `champion` and the gate
    reads the alias back GATE_SETTLE_S (1 s) later; a kill within that lands mid-run. Wrong champions: after the kill,
    `champion` on neither, or on a version without the gate's evidence; after the rerun, the same, the rerun's
    version holding no alias, or a champion whose files do not load. notes: killed_while_running, first_exit, whether
    the killed run printed a traceback, its error lines; the rerun's exit."""
    from shardwise.integrations.mlflow import CHAMPION

    outcome = FaultOutcome("tracking server killed during shardwise publish's registration")
    files = _plan_files(tmp)
    with _registry_for(tmp, server) as (server, kind):
        task, name, url = _plan_champion(server.url, kind, files)
        argv = publish_argv(tmp, task, url)
        env = {**os.environ, "SHARDWISE_CACHE": str(tmp / "cache")}
        before_versions, before_aliases, _ = _registry(server.db, name)
        champion_before = before_aliases[CHAMPION]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _kill_once_registered(proc, server, name, before_versions, delay_s, outcome)
        _, aliases, tags = _registry(server.db, name)
        outcome.wrong_champions += _half_logged_aliases(aliases, tags)
        outcome.wrong_champions += aliases.get(CHAMPION) not in (champion_before, str(before_versions + 1))
        outcome.notes["champion_after_kill"] = aliases.get(CHAMPION)

        code, output = _main_here(argv, env)  # the rerun, in this process: the same command
        outcome.notes["rerun_exit"] = code
        if code != 0:
            outcome.notes["rerun_error"] = _error_line(output)
        versions, aliases, tags = _registry(server.db, name)
        outcome.wrong_champions += _half_logged_aliases(aliases, tags)
        newest = str(versions)
        decision = tags.get(newest, {}).get("gate.decision", "")
        outcome.wrong_champions += code != 0 or aliases.get(decision) != newest
        outcome.notes["champion_after_rerun"] = aliases.get(CHAMPION)
        _registered_champion_loads(url, name, outcome)
        return outcome


def concurrent_plan_registration(tmp: Path, *, ms: tuple[float, float] = (5.0, 3.0),
                                 offsets_s: tuple[float, float] = (0.0, 0.0), compare_s: float = 1.0,
                                 server: MlflowProcess | None = None) -> FaultOutcome:
    """Two publish runs register a plan of one production task at once (champion: 10 ms), the second `offsets_s`
    apart. Wrong champions: the champion afterwards is not the faster plan, an alias on a version without the gate's
    decision for it, or a champion whose files do not load."""
    from shardwise.integrations.mlflow import CHAMPION

    outcome = FaultOutcome("two runs registering a plan of one task at once")
    files = _plan_files(tmp)
    with _registry_for(tmp, server) as (server, kind):
        task, name, url = _plan_champion(server.url, kind, files)
        go = tmp / "go"
        _run_together([_register_plan_argv(url, files, task, m, str(go), offset, compare_s)
                       for m, offset in zip(ms, offsets_s, strict=True)], go, outcome)
        _, aliases, tags = _registry(server.db, name)
        champion = aliases.get(CHAMPION, "")
        outcome.notes["champion_ms"] = tags.get(champion, {}).get("gate.value")
        outcome.wrong_champions = int(float(tags.get(champion, {}).get("gate.value", "nan")) != min(ms))
        outcome.wrong_champions += _half_logged_aliases(aliases, tags)
        _registered_champion_loads(url, name, outcome)
        return outcome


# -- a process SIGKILLed while it makes a new embedded MLflow store ----------------------------------------------

#: a process that opens a new sqlite store and stops inside one of MLflow's migrations, the one that makes the
#: `latest_metrics` table, once the table is made (sqlite commits a CREATE TABLE at once) and before the migration
#: is recorded as done: where a SIGKILLed step was found to leave a store no later run could open. It writes the
#: marker file and waits there to be killed.
_STALLED_CREATION = """
import os, sys, time
from pathlib import Path
from alembic.operations import Operations
create_table = Operations.create_table
def stalled(self, name, *columns, **kwargs):
    made = create_table(self, name, *columns, **kwargs)
    if name == "latest_metrics":
        Path(sys.argv[2]).touch()
        time.sleep(600)
    return made
Operations.create_table = stalled
if sys.argv[3:] == ["mlflow"]:  # MLflow's own client, which migrates the store where it lies (as before the fix)
    from mlflow.tracking import MlflowClient
    MlflowClient(tracking_uri=sys.argv[1]).search_experiments()
from shardwise.integrations.mlflow import MlflowService
MlflowService(sys.argv[1]).log_run(experiment="never", run_name="never", params={}, metrics={})
"""
_LOG_RUN = """
import sys
from shardwise.integrations.mlflow import MlflowService
print(MlflowService(sys.argv[1]).log_run(experiment="after", run_name="after", params={"a": 1}, metrics={"m": 1.0}))
"""


def _kill_in_migrations(uri: str, marker: Path, *args: str) -> None:
    """Start a process that makes the sqlite store at `uri`, and SIGKILL it inside MLflow's migrations."""
    proc = subprocess.Popen([sys.executable, "-c", _STALLED_CREATION, uri, str(marker), *args], cwd=marker.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if not _wait_for(lambda: marker.exists() or proc.poll() is not None, 120, 0.05) or not marker.exists():
            raise RuntimeError(f"the store's migrations never started: {proc.communicate(timeout=60)[0][-2000:]}")
    finally:
        proc.kill()
        proc.wait(60)


def half_made_store(tmp: Path) -> str:
    """The URI of a sqlite store whose making MLflow's own client began and a SIGKILL cut short (what a kill left
    before shardwise made new stores whole or not at all)."""
    tmp.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    _kill_in_migrations(uri, tmp / "migrating", "mlflow")
    return uri


def store_creation_killed(tmp: Path) -> FaultOutcome:
    """A process SIGKILLed while it makes a new sqlite MLflow store (in MLflow's migrations, deterministically: they
    are stalled), then a run logged to the same URI by a fresh process: what a pipeline step killed in its first
    seconds leaves for the rerun. notes: the store's files after the kill, and the second process's exit."""
    tmp.mkdir(parents=True, exist_ok=True)
    uri, marker = f"sqlite:///{tmp / 'mlflow.db'}", tmp / "migrating"
    outcome = FaultOutcome("a process SIGKILLed while making a new sqlite store")
    _kill_in_migrations(uri, marker)
    outcome.notes["store_after_kill"] = _store_files(tmp)
    rerun = subprocess.run([sys.executable, "-c", _LOG_RUN, uri], cwd=tmp, capture_output=True, text=True,
                           timeout=300)
    outcome.notes["rerun_exit"] = rerun.returncode
    if rerun.returncode != 0:
        outcome.error = (rerun.stderr.strip().splitlines() or [""])[-1]
    return outcome


# -- `shardwise pipeline run --local` SIGKILLed in a step ----------------------------------------------------------

#: the smoke preset, smaller still: the fault is in the steps' order, not their sizes. On 2 devices, not smoke's 4:
#: one group of 2 ranks to profile all-to-alls and collectives over, and 2 to measure plans on (a whole run 74 CPU s
#: against 106 on 2 cores, 2026-11-27)
PIPELINE_ARGS = ["--preset", "smoke", "--num-tables", "40", "--task-num-tables", "8", "--num-devices", "2",
                 "--profile-num-shards", "16", "--profile-holdout-shards", "6", "--profile-comm-layouts", "2",
                 "--pretrain-epochs", "3", "--validate-iters", "0", "--refine-rounds", "0", "--policy-tasks", "2",
                 "--policy-episodes", "2"]
_EXECUTING = re.compile(r"Executing task .?\[?\d*m?'([\w-]+)'")
_FINISHED = re.compile(r"Task .?\[?\d*m?'([\w-]+)'.*finished with status .?\[?\d*m?SUCCESS")
_INSTANCES = {"profile-costs": 2}  # the smoke preset's profiling workers


def _failed_step_tail(log: str) -> str:
    """The last lines of a run's log up to its first failed step (the step's traceback): what the rerun's one-line
    error points at."""
    end = re.search(r"finished with status .?\[?\d*m?FAILURE", log)
    return "\n".join(log[: end.end() if end else len(log)].splitlines()[-12:])


def finished_profile_steps(workdir: Path) -> list[Path]:
    """The folders of the profiling steps (each worker's profile-costs, profile-all-to-alls) that finished under
    `workdir`: their executor output is written. kfp.local's log shows two instances of a step finishing at once
    as one or two lines; the folders count each."""
    return [d for d in sorted((workdir / "pipeline_root").glob("*/**/profile-*"))
            if (d / "executor_output.json").is_file()]


def pipeline_costs(workdir: Path) -> Counter[tuple[str, str, int, int]]:
    """(kind, config_id, repeat, device) of every row the finished profiling steps under `workdir` stored: what
    a rerun's pretrain step reads (a finished step is taken from the cache, never run twice; an unfinished step's
    partial dataset is read by nobody)."""
    from shardwise.profiling.dataset import load_costs

    done = [d / "costs" for d in finished_profile_steps(workdir) if (d / "costs").exists()]
    if not done:  # killed before any profiling step finished
        return Counter()
    rows = load_costs(done)
    return Counter(zip(rows["kind"].astype(str), rows["config_id"].astype(str), rows["repeat"].astype(int),
                       rows["device"].fillna(-1).astype(int), strict=True))


def pipeline_run(tmp: Path) -> list[str]:
    """The command line of one local pipeline run (PIPELINE_ARGS) in `tmp`, with its own MLflow store."""
    return [*CLI, "pipeline", "run", "--local", "--workdir", str(tmp / "run"), "--tracking-uri",
            f"sqlite:///{tmp / 'mlflow.db'}", *PIPELINE_ARGS]


def _store_files(tmp: Path) -> list[str]:
    """The MLflow store of `pipeline_run(tmp)` as it is on disk: the sqlite file, or the temporary file shardwise
    makes its schema in (`.mlflow.db.<pid>-<ns>.creating`), with any journal."""
    return sorted(p.name for p in tmp.glob("*mlflow.db*"))


def pipeline_killed(tmp: Path, *, step: str = "pretrain-cost-model", delay_s: float = 1.0,
                    expected: Counter[tuple[str, str, int, int]] | None = None,
                    at_store_creation: bool = False) -> FaultOutcome:
    """`shardwise pipeline run --local` (smaller than the smoke preset) SIGKILLed, with every step process,
    `delay_s` after `step` starts (with `at_store_creation`: after `step` begins making the MLflow store, MLflow's
    tables and migrations, 2-3 s on a 2-core machine in the first step that logs), then run again with the
    same arguments. Rows lost / duplicated: the cost rows the rerun's pretrain step read (`pipeline_costs`)
    against `expected` (a fault-free run's); steps that finished before the kill and ran again (not taken from
    the cache) are in notes["ran_again"]; the rerun's last lines in notes["rerun_tail"] when it failed. Without
    `expected`, rows lost are those the steps finished before the kill had stored (`rows_at_kill`)."""
    import signal

    tmp.mkdir(parents=True, exist_ok=True)
    argv = pipeline_run(tmp)
    log = tmp / "run" / "pipeline.log"
    outcome = FaultOutcome(f"pipeline run --local SIGKILLed in {step}" + " making the store" * at_store_creation)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        started = _wait_for(lambda: proc.poll() is not None or (log.exists() and step in _EXECUTING.findall(
            log.read_text(errors="replace"))), 1200, 0.2)
        if not started or proc.poll() is not None:
            raise RuntimeError(f"the run ended before {step} started: {proc.communicate()[0][-2000:]}")
        if at_store_creation and not _wait_for(lambda: proc.poll() is not None or bool(_store_files(tmp)), 600,
                                               0.005):
            raise RuntimeError(f"{step} made no MLflow store in 600 s")
        time.sleep(delay_s)
        if at_store_creation:
            outcome.notes["store_at_kill"] = _store_files(tmp)
        before = log.read_text(errors="replace")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    finished = Counter(_FINISHED.findall(before))
    outcome.notes["finished_before_kill"] = sorted(finished.elements())
    outcome.rows_at_kill = pipeline_costs(tmp / "run")
    outcome.notes["profile_steps_finished_before_kill"] = len(finished_profile_steps(tmp / "run"))
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    outcome.notes["rerun_exit"] = rerun.returncode
    # a step cache per version of shardwise's source: two, and the rerun ran other code (the checkout edited
    # meanwhile), which reuses nothing the killed run finished
    outcome.notes["code_versions"] = len(list((tmp / "run" / "step_cache").glob("*")))
    if rerun.returncode != 0:
        outcome.error = _error_line(rerun.stderr + rerun.stdout)
        outcome.notes["rerun_tail"] = _failed_step_tail(log.read_text(errors="replace")[len(before):])
        return outcome
    ran = Counter(_EXECUTING.findall(log.read_text(errors="replace")[len(before):]))  # the log goes on
    outcome.notes["rerun_ran"] = sorted(ran.elements())
    # a finished step run again: more runs of it than its instances (the profiling loop's workers) not finished
    outcome.notes["ran_again"] = sorted(step for step, n in finished.items() if ran[step] > _INSTANCES.get(step, 1) - n)
    keys = pipeline_costs(tmp / "run")
    outcome.duplicated_rows = sum(n - 1 for n in keys.values())
    if expected is not None:
        outcome.rows_lost = sum((expected - keys).values())
        outcome.duplicated_rows = max(outcome.duplicated_rows, sum((keys - expected).values()))
    else:  # at least the rows the finished steps had stored at the kill are all there
        outcome.rows_lost = sum((outcome.rows_at_kill - keys).values())
    outcome.notes["rows"] = sum(keys.values())
    return outcome
