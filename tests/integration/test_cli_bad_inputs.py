"""The bad-input corpus: careless and hostile inputs to every verb that reads a file, a URI or a number, each
run through the real `shardwise` entry point. Every one must end with exit code 2 and one error line that names
the input, never a traceback, and nothing written outside the case's output folder."""

from __future__ import annotations

import functools
import gzip
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
import torch
from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables
from search_doubles import random_task
from timing_settings import FLUSH_MIB

from shardwise.cli import main
from shardwise.costmodel import NeuralCostModel, TrainConfig, train_cost_model
from shardwise.workload import save_task

pytestmark = pytest.mark.integration

Content = str | bytes | Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """argv with `{root}` standing for the case's folder; `files` written there first; `expect` in the error."""

    id: str
    argv: list[str]
    expect: str
    files: dict[str, Content] = field(default_factory=dict)


def task_doc(**changes: object) -> dict:
    doc = {
        "format": "shardwise.task/v1", "num_devices": 2, "device_memory_bytes": 400_000_000, "batch_size": 512,
        "tables": [{"name": f"t{i}", "rows": 2_000 + 500 * i, "dim": 16 * (1 + i % 4), "pooling_factor": 4.0 + i,
                    "zipf_alpha": 1.05} for i in range(6)],
    }
    doc.update(changes)
    return doc


def with_table(**changes: object) -> dict:
    doc = task_doc()
    doc["tables"][0] = {**doc["tables"][0], **changes}
    return doc


def plan_doc(**changes: object) -> dict:
    doc = {"format": "shardwise.plan/v1", "num_devices": 2, "method": "hand",
           "shards": [{"table": f"t{i}", "col_offset": 0, "dim": 16 * (1 + i % 4), "device": i % 2}
                      for i in range(6)]}
    doc.update(changes)
    return doc


def tables_doc(**changes: object) -> dict:
    doc = {"format": "shardwise.tables/v1", "batch_size": 512, "tables": task_doc()["tables"]}
    doc.update(changes)
    return doc


def js(doc: object) -> str:
    return json.dumps(doc)


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


@functools.cache
def tiny_model() -> NeuralCostModel:
    """A small real cost model, trained once for the cases that need a sound one (or one to damage)."""
    df = pd.concat([cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0), comm_rows(10, 0)],
                   ignore_index=True)
    return train_cost_model(df, 0, TrainConfig(epochs=3, comm_epochs=3, progress=False))[0]


def copy_model(damage: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """Writes the tiny cost model into the case's folder, then damages it."""
    def write(path: Path) -> None:
        tiny_model().save(path)
        if damage is not None:
            damage(path)
    return write


def nan_weights(path: Path) -> None:
    tensors = torch.load(path / "weights.pt")
    next(iter(tensors.values()))[0] = float("nan")
    torch.save(tensors, path / "weights.pt")


def edit_model_json(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        doc = json.loads((path / "cost_model.json").read_text())
        edit(doc)
        (path / "cost_model.json").write_text(json.dumps(doc))
    return apply


def short_normaliser(doc: dict) -> None:
    for key in ("names", "mean", "std"):
        doc["normaliser"][key] = doc["normaliser"][key][:-1]


def gzip_bomb(path: Path) -> None:
    with gzip.open(path, "wb", compresslevel=9) as out:
        chunk = b"\0" * (1 << 20)
        for _ in range(300):  # 300 MiB inflated, about 300 KB on disk
            out.write(chunk)


def parquet(frame: pd.DataFrame) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        frame.to_parquet(path)
    return write


TASK = js(task_doc())
PLAN = js(plan_doc())
TABLES = js(tables_doc())
T, P = "{root}/task.json", "{root}/plan.json"
OUT = "{root}/out"
ESCAPE = "../../../../escaped"

CASES: list[Case] = [
    # -- task files: task check, plan, evaluate, validate ------------------------------------------------------
    Case("task-missing", ["task", "check", "{root}/nope.json"], "nope.json"),
    Case("task-directory", ["task", "check", "{root}/dir"], "dir", {"dir/x": "1"}),
    Case("task-not-utf8", ["task", "check", T], "task.json", {"task.json": b"\xff\xfe\x00{"}),
    Case("task-empty", ["task", "check", T], "task.json", {"task.json": ""}),
    Case("task-truncated", ["task", "check", T], "task.json", {"task.json": TASK[:40]}),
    Case("task-deep-nesting", ["task", "check", T], "task.json", {"task.json": deep_json(100_000)}),
    Case("task-a-list", ["task", "check", T], "task.json", {"task.json": "[1, 2]"}),
    Case("task-no-format", ["task", "check", T], "format",
         {"task.json": js({k: v for k, v in task_doc().items() if k != "format"})}),
    Case("task-wrong-format", ["task", "check", T], "format", {"task.json": js(task_doc(format="shardwise.plan/v1"))}),
    Case("task-devices-string", ["task", "check", T], "num_devices", {"task.json": js(task_doc(num_devices="4"))}),
    Case("task-devices-bool", ["task", "check", T], "num_devices", {"task.json": js(task_doc(num_devices=True))}),
    Case("task-devices-zero", ["task", "check", T], "num_devices", {"task.json": js(task_doc(num_devices=0))}),
    Case("task-devices-million", ["task", "check", T], "num_devices",
         {"task.json": js(task_doc(num_devices=1_000_000))}),
    Case("task-memory-2^63", ["task", "check", T], "device_memory_bytes",
         {"task.json": js(task_doc(device_memory_bytes=2**63))}),
    Case("task-memory-negative", ["task", "check", T], "device_memory_bytes",
         {"task.json": js(task_doc(device_memory_bytes=-1))}),
    Case("task-infeasible", ["task", "check", T], "GiB",
         {"task.json": js(task_doc(device_memory_bytes=1000))}),
    Case("task-pooling-infinity", ["task", "check", T], "pooling_factor",
         {"task.json": TASK.replace('"pooling_factor": 4.0', '"pooling_factor": Infinity', 1)}),
    Case("task-pooling-nan", ["task", "check", T], "pooling_factor",
         {"task.json": TASK.replace('"pooling_factor": 4.0', '"pooling_factor": NaN', 1)}),
    Case("task-zipf-infinity", ["task", "check", T], "zipf_alpha",
         {"task.json": TASK.replace('"zipf_alpha": 1.05', '"zipf_alpha": Infinity', 1)}),
    Case("task-dim-not-multiple-of-4", ["task", "check", T], "dim", {"task.json": js(with_table(dim=30))}),
    Case("task-rows-zero", ["task", "check", T], "rows", {"task.json": js(with_table(rows=0))}),
    Case("task-rows-float", ["task", "check", T], "rows", {"task.json": js(with_table(rows=10.5))}),
    Case("task-name-missing", ["task", "check", T], "name",
         {"task.json": js(with_table(name=None))}),
    Case("task-duplicate-table", ["task", "check", T], "t1",
         {"task.json": js(task_doc(tables=task_doc()["tables"] + [task_doc()["tables"][1]]))}),
    Case("task-reuse-bins-short", ["task", "check", T], "reuse_bins",
         {"task.json": js(with_table(reuse_bins=[0.5, 0.5]))}),
    Case("task-no-tables", ["task", "check", T], "tables", {"task.json": js(task_doc(tables=[]))}),
    Case("task-duplicate-keys", ["task", "check", T], "num_devices",
         {"task.json": TASK.replace('"num_devices": 2', '"num_devices": 2, "num_devices": 3', 1)}),
    Case("plan-task-is-a-plan", ["plan", "--task", P, "--method", "size_greedy", "--out", f"{OUT}/p.json"],
         "format", {"plan.json": PLAN}),
    Case("plan-out-is-a-directory", ["plan", "--task", T, "--method", "size_greedy", "--out", OUT],
         "out", {"task.json": TASK, "out/keep": "x"}),
    # -- plan: methods, options, models and URIs -----------------------------------------------------------
    Case("plan-unknown-method", ["plan", "--task", T, "--method", "bogus", "--out", f"{OUT}/p.json"], "bogus",
         {"task.json": TASK}),
    Case("plan-beam-width-zero", ["plan", "--task", T, "--model", "{root}/model", "--beam-width", "0",
                                  "--out", f"{OUT}/p.json"], "beam", {"task.json": TASK, "model": copy_model()}),
    Case("plan-time-budget-nan", ["plan", "--task", T, "--model", "{root}/model", "--time-budget-s", "nan",
                                  "--out", f"{OUT}/p.json"], "time", {"task.json": TASK, "model": copy_model()}),
    # the tiny model is for "cpu-test": refining here would tune the plan to the wrong hardware
    Case("plan-refine-other-hardware", ["plan", "--task", T, "--model", "{root}/model", "--refine", "1",
                                        "--device", "cpu", "--out", f"{OUT}/p.json"], "plan is for cpu-test",
         {"task.json": TASK, "model": copy_model()}),
    Case("plan-refine-budget-negative", ["plan", "--task", T, "--model", "{root}/model", "--refine", "1",
                                         "--refine-budget-s", "-1", "--out", f"{OUT}/p.json"], "refine-budget-s",
         {"task.json": TASK, "model": copy_model()}),
    Case("plan-seed-not-int", ["plan", "--task", T, "--method", "size_greedy", "--seed", "x",
                               "--out", f"{OUT}/p.json"], "seed", {"task.json": TASK}),
    Case("plan-model-missing", ["plan", "--task", T, "--model", "{root}/nomodel", "--out", f"{OUT}/p.json"],
         "nomodel", {"task.json": TASK}),
    Case("plan-model-empty-dir", ["plan", "--task", T, "--model", "{root}/model", "--out", f"{OUT}/p.json"],
         "cost_model.json", {"task.json": TASK, "model/x": "1"}),
    Case("plan-model-nan-weights", ["plan", "--task", T, "--model", "{root}/model", "--out", f"{OUT}/p.json"],
         "NaN", {"task.json": TASK, "model": copy_model(nan_weights)}),
    Case("plan-model-short-normaliser", ["plan", "--task", T, "--model", "{root}/model", "--out",
                                         f"{OUT}/p.json"], "normaliser",
         {"task.json": TASK, "model": copy_model(edit_model_json(short_normaliser))}),
    Case("plan-model-pickle-payload", ["plan", "--task", T, "--model", "{root}/model", "--out", f"{OUT}/p.json"],
         "weights", {"task.json": TASK, "model": copy_model(
             lambda p: (p / "weights.pt").write_bytes(b"\x80\x04cos\nsystem\n(S'touch pwned'\ntR."))}),
    Case("plan-model-two-inside", ["plan", "--task", T, "--model", "{root}/models", "--out", f"{OUT}/p.json"],
         "2 cost models", {"task.json": TASK, "models/a": copy_model(), "models/b": copy_model()}),
    Case("plan-model-unknown-alias", ["plan", "--task", T, "--model", "models:/nope@champion",
                                      "--tracking-uri", "sqlite:///{root}/none.db", "--out", f"{OUT}/p.json"],
         "models:/nope@champion", {"task.json": TASK}),
    Case("plan-model-unknown-alias-default-store", ["plan", "--task", T, "--model", "models:/nope@champion",
                                                    "--out", f"{OUT}/p.json"],
         "models:/nope@champion", {"task.json": TASK}),  # the default ./mlflow.db is not created by looking
    Case("plan-bad-uri-scheme", ["plan", "--task", T, "--model", "ftp://host/model", "--out", f"{OUT}/p.json"],
         "ftp://host/model", {"task.json": TASK}),
    Case("plan-postgres-no-driver", ["plan", "--task", T, "--tracking-uri", "postgresql://u:hunter2@127.0.0.1:9/db",
                                     "--out", f"{OUT}/p.json"], "psycopg", {"task.json": TASK}),
    Case("plan-policy-missing", ["plan", "--task", T, "--model", "{root}/model", "--method", "dreamshard",
                                 "--policy", "{root}/nopolicy", "--out", f"{OUT}/p.json"], "nopolicy",
         {"task.json": TASK, "model": copy_model()}),
    Case("plan-policy-broken-json", ["plan", "--task", T, "--model", "{root}/model", "--method", "autoshard",
                                     "--policy", "{root}/policy", "--out", f"{OUT}/p.json"], "policy.json",
         {"task.json": TASK, "model": copy_model(), "policy/policy.json": "{", "policy/weights.pt": b""}),
    Case("plan-infeasible-task", ["plan", "--task", T, "--method", "size_greedy", "--out", f"{OUT}/p.json"],
         "GiB missing", {"task.json": js(task_doc(device_memory_bytes=100_000))}),
    Case("task-name-not-utf8", ["task", "check", "{root}/" + os.fsdecode(b"\xfe.json")], "num_devices",
         {os.fsdecode(b"\xfe.json"): js(task_doc(num_devices="4"))}),
    # -- evaluate and validate: plans and report names ---------------------------------------------------------
    Case("evaluate-plan-missing", ["evaluate", "--task", T, "--plan", "{root}/none.json", "--out", OUT],
         "none.json", {"task.json": TASK}),
    Case("evaluate-plan-unknown-table", ["evaluate", "--task", T, "--plan", P, "--out", OUT], "t99",
         {"task.json": TASK, "plan.json": js(plan_doc(shards=[*plan_doc()["shards"],
                                                             {"table": "t99", "col_offset": 0, "dim": 8,
                                                              "device": 0}]))}),
    Case("evaluate-plan-device-out-of-range", ["evaluate", "--task", T, "--plan", P, "--out", OUT], "device",
         {"task.json": TASK, "plan.json": js(plan_doc(shards=[{**s, "device": 7} for s in plan_doc()["shards"]]))}),
    Case("evaluate-plan-columns-overlap", ["evaluate", "--task", T, "--plan", P, "--out", OUT], "t0",
         {"task.json": TASK, "plan.json": js(plan_doc(shards=[*plan_doc()["shards"],
                                                             {"table": "t0", "col_offset": 0, "dim": 16,
                                                              "device": 1}]))}),
    Case("evaluate-plan-missing-table", ["evaluate", "--task", T, "--plan", P, "--out", OUT], "t5",
         {"task.json": TASK, "plan.json": js(plan_doc(shards=plan_doc()["shards"][:5]))}),
    Case("evaluate-plan-over-memory", ["evaluate", "--task", T, "--plan", P, "--out", OUT], "over its cap",
         {"task.json": js(task_doc(device_memory_bytes=700_000)),
          "plan.json": js(plan_doc(shards=[{**s, "device": 0} for s in plan_doc()["shards"]]))}),
    Case("evaluate-plan-devices-mismatch", ["evaluate", "--task", T, "--plan", P, "--out", OUT], "num_devices",
         {"task.json": TASK, "plan.json": js(plan_doc(num_devices=3))}),
    Case("evaluate-plan-dim-string", ["evaluate", "--task", T, "--plan", P, "--out", OUT], "dim",
         {"task.json": TASK, "plan.json": js(plan_doc(shards=[{**plan_doc()["shards"][0], "dim": "16"},
                                                             *plan_doc()["shards"][1:]]))}),
    Case("evaluate-name-escapes", ["evaluate", "--task", T, "--plan", P, "--name", ESCAPE, "--out", OUT], "name",
         {"task.json": TASK, "plan.json": PLAN}),
    Case("evaluate-timing-iters-zero", ["evaluate", "--task", T, "--plan", P, "--timing-iters", "0",
                                        "--out", OUT], "timing", {"task.json": TASK, "plan.json": PLAN}),
    Case("evaluate-batch-negative", ["evaluate", "--task", T, "--plan", P, "--batch-size", "-5", "--out", OUT],
         "batch", {"task.json": TASK, "plan.json": PLAN}),
    Case("evaluate-bad-model", ["evaluate", "--task", T, "--plan", P, "--model", "{root}/model", "--out", OUT],
         "model", {"task.json": TASK, "plan.json": PLAN,
                   "model": copy_model(lambda p: (p / "weights.pt").write_bytes(b"garbage"))}),
    Case("evaluate-model-missing-field", ["evaluate", "--task", T, "--plan", P, "--model", "{root}/model",
                                          "--out", OUT], "batch_size",
         {"task.json": TASK, "plan.json": PLAN,
          "model": copy_model(edit_model_json(lambda doc: doc["meta"].pop("batch_size")))}),
    Case("evaluate-model-unknown-alias", ["evaluate", "--task", T, "--plan", P, "--model", "models:/nope@champion",
                                          "--tracking-uri", "sqlite:///{root}/none.db", "--out", OUT],
         "models:/nope@champion", {"task.json": TASK, "plan.json": PLAN}),
    Case("evaluate-device-tpu", ["evaluate", "--task", T, "--plan", P, "--device", "tpu", "--out", OUT],
         "device", {"task.json": TASK, "plan.json": PLAN}),
    Case("validate-plan-wrong-format", ["validate", "--task", T, "--plan", P, "--out", OUT], "format",
         {"task.json": TASK, "plan.json": js(plan_doc(format="shardwise.task/v1"))}),
    Case("validate-out-is-a-directory", ["validate", "--task", T, "--plan", P, "--out", OUT], "is a directory",
         {"task.json": TASK, "plan.json": PLAN, "out/kept.json": "{}"}),
    Case("validate-iters-zero", ["validate", "--task", T, "--plan", P, "--iters", "0", "--out", OUT], "iters",
         {"task.json": TASK, "plan.json": PLAN}),
    # -- table files, index files: workload, augment, profile, train-policy, benchmark -------------------------
    Case("split-tables-missing", ["workload", "split", "--tables", "{root}/none.json", "--out", OUT], "none.json"),
    Case("split-fraction-one", ["workload", "split", "--tables", "{root}/tables.json", "--holdout-fraction", "1.0",
                                "--out", OUT], "holdout", {"tables.json": TABLES}),
    Case("split-tables-is-a-task", ["workload", "split", "--tables", T, "--out", OUT], "format",
         {"task.json": TASK}),
    Case("task-from-too-few-tables", ["workload", "task", "--tables", "{root}/tables.json", "--num-tables", "50",
                                      "--num-devices", "2", "--out", f"{OUT}/t.json"], "50",
         {"tables.json": TABLES}),
    Case("task-memory-slack-nan", ["workload", "task", "--tables", "{root}/tables.json", "--num-tables", "3",
                                   "--num-devices", "2", "--memory-slack", "nan", "--out", f"{OUT}/t.json"],
         "memory", {"tables.json": TABLES}),
    Case("task-memory-slack-inf", ["workload", "task", "--tables", "{root}/tables.json", "--num-tables", "3",
                                   "--num-devices", "2", "--memory-slack", "inf", "--out", f"{OUT}/t.json"],
         "memory", {"tables.json": TABLES}),
    Case("synth-negative-tables", ["workload", "synth", "--num-tables", "-3", "--out", OUT], "--num-tables"),
    Case("synth-row-scale-zero", ["workload", "synth", "--num-tables", "3", "--row-scale", "0", "--out", OUT],
         "--row-scale"),
    Case("augment-tables-batch-bool", ["augment", "--tables", "{root}/tables.json", "--out", OUT], "batch_size",
         {"tables.json": js(tables_doc(batch_size=True))}),
    Case("augment-dims-garbage", ["augment", "--tables", "{root}/tables.json", "--dims", "x,y", "--out", OUT],
         "dims", {"tables.json": TABLES}),
    Case("profile-index-gzip-bomb", ["profile", "--tables", "{root}/tables.json", "--indices", "{root}/idx.pt",
                                     "--num-shards", "2", "--out", f"{OUT}/costs"], "idx.pt",
         {"tables.json": TABLES, "idx.pt": gzip_bomb}),
    Case("profile-index-truncated-gzip", ["profile", "--tables", "{root}/tables.json", "--indices",
                                          "{root}/idx.pt", "--num-shards", "2", "--out", f"{OUT}/costs"], "idx.pt",
         {"tables.json": TABLES, "idx.pt": gzip.compress(b"\0" * 100_000)[:300]}),
    Case("profile-index-pickle-payload", ["profile", "--tables", "{root}/tables.json", "--indices",
                                          "{root}/idx.pt", "--num-shards", "2", "--out", f"{OUT}/costs"], "idx.pt",
         {"tables.json": TABLES, "idx.pt": b"\x80\x04cos\nsystem\n(S'touch pwned'\ntR."}),
    Case("profile-nothing-to-measure", ["profile", "--tables", "{root}/tables.json", "--num-shards", "0",
                                        "--comm-layouts", "0", "--out", f"{OUT}/costs"], "num_shards",
         {"tables.json": TABLES}),
    Case("profile-max-devices-one", ["profile", "--tables", "{root}/tables.json", "--num-shards", "2",
                                     "--comm-layouts", "2", "--max-devices", "1", "--out", f"{OUT}/costs"],
         "--max-devices", {"tables.json": TABLES}),
    Case("profile-threads-negative", ["profile", "--tables", "{root}/tables.json", "--threads", "-1",
                                      "--out", f"{OUT}/costs"], "threads", {"tables.json": TABLES}),
    Case("train-policy-unknown-method", ["train-policy", "--method", "neuroshard", "--tables",
                                         "{root}/tables.json", "--model", "{root}/model", "--out", OUT],
         "neuroshard", {"tables.json": TABLES, "model": copy_model()}),
    Case("train-policy-bad-model", ["train-policy", "--method", "dreamshard", "--tables", "{root}/tables.json",
                                    "--model", "{root}/model", "--out", OUT], "model",
         {"tables.json": TABLES, "model": copy_model(edit_model_json(lambda d: d.update(format="v0")))}),
    Case("train-policy-episodes-zero", ["train-policy", "--method", "autoshard", "--tables", "{root}/tables.json",
                                        "--model", "{root}/model", "--episodes", "0", "--out", OUT], "episodes",
         {"tables.json": TABLES, "model": copy_model()}),
    Case("benchmark-unknown-task-set", ["benchmark", "--tables", "{root}/tables.json", "--task-sets", "nope",
                                        "--methods", "size_greedy", "--out", OUT], "nope",
         {"tables.json": TABLES}),
    Case("benchmark-unknown-method", ["benchmark", "--tables", "{root}/tables.json", "--methods", "bogus",
                                      "--out", OUT], "bogus", {"tables.json": TABLES}),
    # -- cost datasets: pretrain ----------------------------------------------------------------------------
    Case("pretrain-data-missing", ["pretrain", "--data", "{root}/none.parquet", "--out", OUT, "--no-register"],
         "none.parquet"),
    Case("pretrain-data-not-parquet", ["pretrain", "--data", "{root}/costs", "--out", OUT, "--no-register"],
         "part-0.parquet: not a readable Parquet file", {"costs/part-0.parquet": "not parquet"}),
    Case("pretrain-data-wrong-columns", ["pretrain", "--data", "{root}/costs", "--out", OUT, "--no-register"],
         "part-0.parquet: missing columns",
         {"costs/part-0.parquet": parquet(pd.DataFrame({"a": [1, 2], "b": [3.0, 4.0]}))}),
    Case("pretrain-data-single-file", ["pretrain", "--data", "{root}/costs.parquet", "--out", OUT, "--no-register"],
         "costs.parquet: a single file, not a cost dataset",
         {"costs.parquet": parquet(pd.DataFrame({"a": [1, 2], "b": [3.0, 4.0]}))}),
    Case("pretrain-epochs-zero", ["pretrain", "--data", "{root}/costs.parquet", "--epochs", "0", "--out", OUT,
                                  "--no-register"], "epochs", {"costs.parquet": "x"}),
    Case("pretrain-holdout-fraction-two", ["pretrain", "--data", "{root}/costs.parquet", "--holdout-fraction",
                                           "2", "--out", OUT, "--no-register"], "holdout", {"costs.parquet": "x"}),
    # -- config files and pipeline arguments ------------------------------------------------------------------
    Case("config-typo", ["plan", "--task", T, "--config", "{root}/c.yaml", "--out", f"{OUT}/p.json"], "c.yaml",
         {"task.json": TASK, "c.yaml": "bogus_key: 1\n"}),
    Case("config-not-a-mapping", ["plan", "--task", T, "--config", "{root}/c.yaml", "--out", f"{OUT}/p.json"],
         "c.yaml", {"task.json": TASK, "c.yaml": "- 1\n- 2\n"}),
    Case("config-broken-yaml", ["plan", "--task", T, "--config", "{root}/c.yaml", "--out", f"{OUT}/p.json"],
         "c.yaml", {"task.json": TASK, "c.yaml": "a: [1,\n"}),
    Case("pipeline-device-tpu", ["pipeline", "run", "--local", "--workdir", OUT, "--device", "tpu"], "device"),
    Case("pipeline-devices-negative", ["pipeline", "run", "--local", "--workdir", OUT, "--num-devices", "-3"],
         "num_devices"),
    Case("pipeline-unknown-method", ["pipeline", "run", "--local", "--workdir", OUT, "--search-method", "bogus"],
         "bogus"),
    Case("pipeline-unknown-parameter", ["pipeline", "run", "--local", "--workdir", OUT, "--nope", "1"], "--nope"),
    Case("pipeline-parameter-mistyped", ["pipeline", "schedule", "--host", "http://127.0.0.1:9", "--cron", "0 3 * * *",
                                         "--num-tables", "many"], "--num-tables"),
    Case("pipeline-parameter-out-of-range", ["pipeline", "submit", "--host", "http://127.0.0.1:9",
                                             "--holdout-fraction", "1.5"], "holdout_fraction"),
    Case("pipeline-unknown-preset", ["pipeline", "run", "--local", "--workdir", OUT, "--preset", "huge"], "huge"),
    Case("pipeline-submit-unknown-method", ["pipeline", "submit", "--host", "http://127.0.0.1:9",
                                            "--search-method", "bogus"], "bogus"),
    Case("pipeline-submit-unreachable", ["pipeline", "submit", "--host", "http://user:hunter2@127.0.0.1:9",
                                         "--preset", "smoke"], "127.0.0.1:9"),
]


def _write(root: Path, name: str, content: Content) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


def test_the_corpus_is_large_and_distinct():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
    verbs = {c.argv[0] for c in CASES}
    assert {"task", "plan", "evaluate", "validate", "workload", "augment", "profile", "pretrain", "train-policy",
            "benchmark", "pipeline"} <= verbs


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_escapes(case, tmp_path, monkeypatch, capsys):
    sandbox = tmp_path / "a" / "b" / "c" / "d"  # room for ../../../../ to land inside tmp_path, where we look
    root = sandbox / "case"
    root.mkdir(parents=True)
    for name, content in case.files.items():
        _write(root, name, content)
    monkeypatch.chdir(root)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    before = _tree(tmp_path)
    argv = [a.replace("{root}", str(root)) for a in case.argv]

    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors exit from inside parse_args
        code = exit_.code

    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if ": error:" in line]
    assert code == 2 and len(errors) == 1, f"exit {code}, stderr:\n{err}"
    assert case.expect.lower() in errors[0].lower(), errors[0]
    assert "hunter2" not in out + err
    after = _tree(tmp_path)
    written = {p for p in after if before.get(p) != after[p]}
    outside = sorted(p for p in written if not p.startswith(str((root / "out").relative_to(tmp_path))))
    assert outside == [], f"written outside the output folder: {outside}"
    assert not (root / "pwned").exists() and not Path(os.getcwd(), "pwned").exists()


def test_plan_methods_that_look_like_paths_name_reports_inside_the_output_folder(tmp_path, monkeypatch, capsys):
    """Report names come from each plan's `method` when file names collide: a hostile one stays inside --out."""
    root = tmp_path / "a" / "b" / "c" / "d" / "case"
    absolute = tmp_path / "elsewhere" / "escaped"  # an absolute path as a method name
    for name, doc in (("x/plan.json", plan_doc(method=ESCAPE)), ("y/plan.json", plan_doc()),
                      ("z/plan.json", plan_doc(method=str(absolute))), ("task.json", None)):
        _write(root, name, TASK if doc is None else js(doc))
    monkeypatch.chdir(root)
    before = _tree(tmp_path)
    # the lightest measurement (where reports go is what is checked): no calibration, one timing a shard
    assert main(["evaluate", "--task", "task.json", "--plan", "x/plan.json", "--plan", "y/plan.json",
                 "--plan", "z/plan.json", "--warmup-iters", "1", "--timing-iters", "1", "--timing-rounds", "1",
                 "--comm-iters", "1", "--comm-rounds", "1", "--flush-mib", str(FLUSH_MIB), "--reference-ms", "1",
                 "--out", "out"]) == 0, capsys.readouterr().err
    after = _tree(tmp_path)
    written = {p for p in after if before.get(p) != after[p]}
    assert written and all(p.startswith("a/b/c/d/case/out/") for p in written), sorted(written)
    assert not absolute.parent.exists()


def test_a_good_input_passes_the_same_checks(tmp_path, monkeypatch, capsys):
    """The harness can tell success from failure: a sound task plans, exit 0, the plan is in the output folder."""
    monkeypatch.chdir(tmp_path)
    save_task(random_task(0, 6, 2), tmp_path / "task.json")
    assert main(["plan", "--task", "task.json", "--method", "size_greedy", "--out", "out/p.json"]) == 0
    assert json.loads((tmp_path / "out" / "p.json").read_text())["format"] == "shardwise.plan/v1"
