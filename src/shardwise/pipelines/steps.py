"""What the pipeline components run inside their container: the `shardwise` call and small IO helpers.

No kfp imports here: in a step's container KFP sets _KFP_RUNTIME=true, and kfp.dsl then lacks the
pipeline-building API (kfp.kubernetes does not even import).
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MEASURED_FORMAT = "shardwise.measured/v1"


class StepError(RuntimeError):
    """A `shardwise` verb run by a pipeline step exited with a non-zero status."""


def run_step(argv: Sequence[str]) -> None:
    """Run one `shardwise` verb in-process (same as the console script); raise if it fails."""
    from shardwise.cli import main

    print("+ shardwise " + " ".join(argv), flush=True)
    status = main(list(argv))
    if status != 0:
        raise StepError(f"`shardwise {' '.join(argv)}` exited with status {status}")


def copy_file(src: str | Path, dst: str | Path) -> None:
    """Copy one file into an output artifact's path."""
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def profile_argvs(
    tables: str,
    holdout_tables: str,
    out: str,
    *,
    num_shards: int,
    holdout_shards: int,
    comm_layouts: int,
    max_tables: int,
    repeats: int,
    seed: int,
    device: str,
) -> list[list[str]]:
    """The profile step's `shardwise profile` calls: shards of the training tables (and the all-to-alls), then
    `holdout_shards` shards built only from the held-out tables (seed + 1), appended to the same dataset.

    Profiled apart, the held-out tables never share a shard with training tables: `shardwise pretrain
    --holdout-tables` then trains on every training shard and evaluates on every held-out one.
    """
    if holdout_shards < 1:
        raise ValueError(
            f"holdout_shards {holdout_shards}: the pretrain step evaluates (and its promotion gate compares) on "
            "shards of held-out tables; profile at least 1 (20 or more for meaningful metrics)"
        )
    common = ["--max-tables", str(max_tables), "--repeats", str(repeats), "--device", device]
    return [
        ["profile", "--tables", tables, "--out", out, "--num-shards", str(num_shards),
         "--comm-layouts", str(comm_layouts), "--seed", str(seed), *common],
        # all-to-alls depend on widths, not on which tables: measured once, in the first call
        ["profile", "--tables", holdout_tables, "--out", out, "--num-shards", str(holdout_shards),
         "--comm-layouts", "0", "--seed", str(seed + 1), *common],
    ]


def model_ref(model_alias: str, hardware_kind: str, model_path: str | None) -> str | None:
    """The cost model a step uses: the registered `shardwise-cost-<hardware>@alias`, else this run's model."""
    if model_alias:
        return f"models:/shardwise-cost-{hardware_kind}@{model_alias}"
    return model_path


def evaluation_metrics(csv_path: str | Path) -> dict[str, float]:
    """`<row label>_<column>` for each numeric cell of the evaluation table `shardwise pretrain` writes."""
    import pandas as pd

    table = pd.read_csv(csv_path)
    label_column = table.columns[0]
    out: dict[str, float] = {}
    for _, row in table.iterrows():
        label = str(row[label_column]).strip().replace(" ", "_")
        for column in table.columns[1:]:
            value = row[column]
            if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
                out[f"{label}_{column}"] = float(value)
    return out


def training_size_metrics(model_dir: str | Path) -> dict[str, float]:
    """`train_shards` and `heldout_sources` from the provenance a saved cost model keeps in its config file
    (read without loading the weights)."""
    from shardwise.costmodel.model import CONFIG_FILE

    info = json.loads((Path(model_dir) / CONFIG_FILE).read_text())["meta"].get("info") or {}
    return {key: float(info[key]) for key in ("train_shards", "heldout_sources") if key in info}


def load_measured(directory: str | Path) -> dict[str, Any]:
    """The `shardwise.measured/v1` document that `shardwise evaluate --out DIR` wrote under DIR."""
    for path in sorted(Path(directory).rglob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("format") == MEASURED_FORMAT:
            return doc
    raise FileNotFoundError(f"no {MEASURED_FORMAT} document under '{directory}' (did `shardwise evaluate` run?)")


def plan_names(method: str) -> tuple[str, str]:
    """The names the evaluate step gives the searched plan and TorchRec's (distinct even for method torchrec)."""
    return (method, "torchrec") if method != "torchrec" else (method, "torchrec-baseline")


def load_evaluation(directory: str | Path, names: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The measured documents `shardwise evaluate --name N ... --out DIR` wrote (by name) and its HTML pages."""
    directory = Path(directory)
    docs = {}
    for name in names:
        path = directory / f"{name}.measured.json"
        if not path.is_file():
            raise FileNotFoundError(f"no {MEASURED_FORMAT} document '{path}' (did `shardwise evaluate` run?)")
        docs[name] = json.loads(path.read_text())
    reports = {page.name: str(page) for page in sorted(directory.glob("*.html"))}
    return docs, reports


def comparison(method_doc: Mapping[str, Any], baseline_doc: Mapping[str, Any]) -> dict[str, float]:
    """Measured plan cost of the chosen method against TorchRec's planner (ratio < 1: the method wins)."""
    method_ms = float(method_doc["max_cost_ms"])
    baseline_ms = float(baseline_doc["max_cost_ms"])
    return {
        "method_max_cost_ms": method_ms,
        "torchrec_max_cost_ms": baseline_ms,
        "ratio_to_torchrec": method_ms / baseline_ms if baseline_ms > 0 else float("nan"),
        "method_imbalance": float(method_doc.get("imbalance", float("nan"))),
        "torchrec_imbalance": float(baseline_doc.get("imbalance", float("nan"))),
    }


def throughput_comparison(validate_json: str | Path) -> dict[str, float]:
    """DLRM samples/s of the chosen plan and TorchRec's from `shardwise validate --out` (ratio > 1: the method wins)."""
    method, baseline = json.loads(Path(validate_json).read_text())[:2]
    method_sps, baseline_sps = float(method["samples_per_s"]), float(baseline["samples_per_s"])
    return {
        "method_samples_per_s": method_sps,
        "torchrec_samples_per_s": baseline_sps,
        "throughput_ratio_to_torchrec": method_sps / baseline_sps if baseline_sps > 0 else float("nan"),
    }


def _device_rows(doc: Mapping[str, Any]) -> str:
    columns = ("device", "fwd_ms", "bwd_ms", "comm_fwd_ms", "comm_bwd_ms", "total_ms", "memory_bytes")
    head = "".join(f"<th>{c}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(row.get(c, '')))}</td>" for c in columns) + "</tr>"
        for row in doc.get("devices", [])
    )
    return f"<table border='1'><tr>{head}</tr>{body}</table>"


def comparison_html(
    method: str, result: Mapping[str, float], docs: Mapping[str, Mapping[str, Any]], reports: Mapping[str, str]
) -> str:
    """A self-contained HTML page: the measured comparison, per-device costs of each plan, report paths."""
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.4g}</td></tr>" for k, v in result.items())
    per_plan = "".join(f"<h2>{html.escape(name)}: per device (measured)</h2>{_device_rows(doc)}"
                       for name, doc in docs.items())
    links = "".join(f"<li>{html.escape(name)}: <code>{html.escape(path)}</code></li>" for name, path in reports.items())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>shardwise: measured comparison</title>"
        "</head><body>"
        f"<h1>{html.escape(method)} vs TorchRec's planner (measured)</h1>"
        f"<table border='1'><tr><th>metric</th><th>value</th></tr>{rows}</table>{per_plan}"
        f"<h2>Detailed reports</h2><ul>{links}</ul></body></html>"
    )
