"""Registered versions cached by (registry, name, version): the next `plan` with the champion downloads nothing (its
alias read with MLflow's client; a plan with a model directory imports no MLflow, nor scipy, pandas, kfp), a champion
alias moved to another version is picked up, a store made again at the same
path is not served its old copies, an entry damaged or left half-written is not used, and two first loads at
once leave one whole entry. A real MLflow sqlite store; `plan` and the loads in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from search_doubles import random_task

from shardwise.cli import main
from shardwise.integrations.mlflow import MlflowService, champion_uri, policy_name
from shardwise.integrations.mlflow_registry import ENTRY_FILE, ModelCache, cache_root
from shardwise.workload import save_task

pytestmark = pytest.mark.integration
NAME = policy_name("dreamshard", "cpu-itest")
#: modules a plan with a model directory must not import
HEAVY = ("mlflow", "scipy", "pandas", "kfp", "sqlalchemy", "pyarrow")


@pytest.fixture
def store(tmp_path, monkeypatch, new_store):
    """An embedded sqlite store named by absolute URI, its artifacts beside it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) is relative to the working directory
    return new_store(tmp_path / "reg.db")


def _policy(root: Path, mark: str) -> Path:
    """A policy directory whose policy.json carries `mark` (what a load reads back)."""
    root.mkdir(parents=True)
    (root / "policy.json").write_text(json.dumps({"format": "shardwise.policy/v1", "method": "dreamshard",
                                                  "mark": mark}))
    torch.save({"w": torch.full((3,), float(len(mark)))}, root / "weights.pt")
    return root


def _register(uri: str, root: Path, mark: str) -> str:
    logged = MlflowService(uri).log_policy(_policy(root, mark), method="dreamshard", hardware_kind="cpu-itest",
                                           history=[], params={}, validation_cost=float(len(mark)))
    assert logged.promotion is not None
    return logged.promotion.version


def _mark(uri: str, ref: str = champion_uri(NAME)) -> str:
    return str(MlflowService(uri).load(ref, lambda d: json.loads((d / "policy.json").read_text())["mark"]))


def _mark_in_fresh_process(uri: str) -> subprocess.Popen:
    """A new interpreter printing the champion's mark (no MLflow state shared with this one)."""
    code = ("import json, sys\n"
            "from shardwise.integrations.mlflow import MlflowService\n"
            "print(MlflowService(sys.argv[1]).load(sys.argv[2], "
            "lambda d: json.loads((d / 'policy.json').read_text())['mark']))\n")
    return subprocess.Popen([sys.executable, "-c", code, uri, champion_uri(NAME)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ)


def test_the_second_plan_reads_the_champion_from_the_cache_and_a_model_directory_imports_no_mlflow(
        store, tmp_path, tiny_cost_model):
    model, report = tiny_cost_model
    MlflowService(store).log_cost_model(model, report)  # labelled with this machine's kind: the champion here
    task = save_task(random_task(0, 12, 4), tmp_path / "task.json")
    argv = ["plan", "--task", str(task), "--device", "cpu", "--tracking-uri", store, "--out"]
    entries = cache_root() / "models"
    assert not entries.exists() or not any(entries.iterdir())  # registering cached nothing
    # the first plan (here) downloads the champion with MLflow into the cache
    assert main([*argv, str(tmp_path / "a.json")]) == 0
    assert len([p for p in entries.iterdir() if not p.name.startswith(".")]) == 1
    # the second, in a fresh interpreter, asks MLflow's client for the alias and reads the files from the cache
    second = ("import sys\n"
              "from shardwise.cli import main\n"
              "from shardwise.integrations.mlflow import MlflowService\n"
              "def downloaded(*args): raise AssertionError('downloaded again')\n"
              "MlflowService._fetch = downloaded\n"
              "sys.exit(main(sys.argv[1:]))\n")
    # beside it, with a model directory, in a fresh interpreter: nothing heavy is imported
    model.save(tmp_path / "model")
    local = ("import sys\n"
             "from shardwise.cli import main\n"
             "status = main(sys.argv[1:])\n"
             f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
             "sys.exit(status)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, *line], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=os.environ)
             for code, line in ((second, [*argv, str(tmp_path / "b.json")]),
                                (local, ["plan", "--task", str(task), "--device", "cpu", "--model",
                                         str(tmp_path / "model"), "--out", str(tmp_path / "c.json")]))]
    (_, cached_err), (local_out, local_err) = (proc.communicate(timeout=300) for proc in procs)
    assert procs[0].returncode == 0, cached_err[-2000:]
    assert procs[1].returncode == 0, local_err[-2000:]
    assert local_out.strip().splitlines()[-1] == "[]"
    plans = [json.loads((tmp_path / out).read_text()) for out in ("a.json", "b.json", "c.json")]
    assert plans[0]["shards"] == plans[1]["shards"] == plans[2]["shards"]


def test_a_moved_champion_is_picked_up_and_each_version_has_its_own_entry(store, tmp_path):
    first = _register(store, tmp_path / "p1", "first")
    assert _mark(store) == "first"
    second = _register(store, tmp_path / "p2", "second")  # not comparable without a champion value: it wins
    assert _mark(store) == "second"  # the alias is read on every load; the new version is downloaded
    MlflowService(store)._client().set_registered_model_alias(NAME, "champion", first)  # rolled back by hand
    assert _mark(store) == "first"
    assert _mark(store, f"models:/{NAME}/{second}") == "second"
    entries = sorted(p.name for p in (cache_root() / "models").iterdir() if not p.name.startswith("."))
    assert len(entries) == 2 and entries[0].startswith(f"{NAME}-v{first}-") and entries[1].startswith(f"{NAME}-v{second}-")


#: a fresh interpreter printing the champion's mark with MLflow unimportable: only the kept answer and the cached
#: files can serve it
_WITHOUT_MLFLOW = (
    "import json, sys\n"
    "class NoMlflow:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'mlflow':\n"
    "            raise ImportError('mlflow was imported')\n"
    "sys.meta_path.insert(0, NoMlflow())\n"
    "from shardwise.integrations.mlflow import MlflowService\n"
    "print(MlflowService(sys.argv[1]).load(sys.argv[2], lambda d: json.loads((d / 'policy.json').read_text())['mark']))\n"
)


def _without_mlflow(uri: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _WITHOUT_MLFLOW, uri, champion_uri(NAME)], capture_output=True,
                          text=True, timeout=300, env=os.environ)


def _still(db: Path, ago_s: float) -> None:
    """The store's file (and its write-ahead log, if any) last written `ago_s` seconds ago: as if nothing wrote it
    since (a store written within STILL_S seconds keeps no answer)."""
    for path in (db, db.with_name(f"{db.name}-wal")):
        if path.exists():
            os.utime(path, (time.time() - ago_s, time.time() - ago_s))


def test_the_champion_is_read_from_the_cache_without_mlflow_until_the_store_changes(store, tmp_path):
    db = tmp_path / "reg.db"
    _register(store, tmp_path / "p1", "first")
    assert _without_mlflow(store).returncode != 0  # nothing kept yet: MLflow's client must be asked
    _still(db, 60)
    assert _mark(store) == "first"  # asked of MLflow's client; the answer kept with the store's stamp
    done = _without_mlflow(store)
    assert done.returncode == 0 and done.stdout.split()[-1] == "first", done.stderr[-2000:]
    # the alias moves (a second version wins the gate): the store's file changes, so the kept answer is not served
    _register(store, tmp_path / "p2", "second")
    _still(db, 30)
    done = _without_mlflow(store)
    assert done.returncode != 0 and "mlflow was imported" in done.stderr, done.stdout
    assert _mark(store) == "second"
    done = _without_mlflow(store)
    assert done.returncode == 0 and done.stdout.split()[-1] == "second", done.stderr[-2000:]
    # a store written just now keeps no answer: a second write within the file time's resolution could not be seen
    MlflowService(store)._client().set_registered_model_alias(NAME, "champion", "1")
    assert _mark(store) == "first"
    assert _without_mlflow(store).returncode != 0


def test_a_store_made_again_at_the_same_path_is_not_served_its_old_copy(store, tmp_path, new_store):
    _register(store, tmp_path / "p1", "old")
    assert _mark(store) == "old"
    again = tmp_path / "again.db"
    _register(new_store(again), tmp_path / "p2", "new")  # version 1 again, other files
    os.replace(again, tmp_path / "reg.db")  # the store made again where the old one was
    assert _mark_in_fresh_process(store).communicate(timeout=300)[0].strip().splitlines()[-1] == "new"


def test_a_damaged_or_half_written_entry_is_not_used(store, tmp_path):
    _register(store, tmp_path / "p1", "whole")
    assert _mark(store) == "whole"
    ref = MlflowService(store).registered_version(NAME, alias="champion")
    cache = ModelCache()
    entry = cache.entry(ref)
    assert cache.get(ref) == entry / "files"

    # a file changed after it was written: the manifest no longer matches, so the version is fetched again
    (entry / "files" / "policy.json").write_text('{"format": "shardwise.policy/v1", "mark": "tampered"}')
    assert cache.get(ref) is None and _mark(store) == "whole" and cache.get(ref) is not None
    # a weights file cut short
    weights = entry / "files" / "weights.pt"
    weights.write_bytes(weights.read_bytes()[:10])
    assert cache.get(ref) is None
    assert MlflowService(store).load(champion_uri(NAME), lambda d: torch.load(d / "weights.pt"))["w"].shape == (3,)
    # an entry without its manifest (as a writer killed between its files and the manifest would leave it)
    (entry / ENTRY_FILE).unlink()
    assert cache.get(ref) is None and _mark(store) == "whole" and (entry / ENTRY_FILE).is_file()
    # a stale temporary from an interrupted writer is neither used nor in the way
    stale = cache.root / ".tmp-interrupted"
    (stale / "files").mkdir(parents=True)
    os.utime(stale, (0, 0))
    (entry / ENTRY_FILE).unlink()
    assert _mark(store) == "whole" and not stale.exists()


def test_two_first_loads_at_once_both_succeed_and_leave_one_whole_entry(store, tmp_path):
    _register(store, tmp_path / "p1", "shared")
    procs = [_mark_in_fresh_process(store) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == ["shared", "shared"]
    names = [p.name for p in (cache_root() / "models").iterdir()]
    assert len(names) == 1 and not names[0].startswith(".")
    ref = MlflowService(store).registered_version(NAME, alias="champion")
    assert ModelCache().get(ref) is not None
