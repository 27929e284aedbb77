"""The main job's figures: what `make run` (the local pipeline) measured, read from its work directory.

    make run && python scripts/make_run_figures.py [--workdir runs/local] [--record]

Measures nothing itself: it reads the latest finished run under WORKDIR/pipeline_root (the pretrain step's
held-out accuracy next to TorchRec's estimator and the noise floor, and the held-out tables' kernels as other
sharding types next to the whole shards' and the compute network's; the evaluate step's measured plan cost and DLRM
throughput next to TorchRec's planner, the refined plan next to the plan it refined in both sessions) and prints each
figure beside its comparison. `make run`'s time on a
busy machine is scripts/newcomer.py's figure. A run whose evaluate step has not finished is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks' record.py
from benchmarks.record import record  # noqa: E402

from shardwise.pipelines.run import run_figures


def latest_run(workdir: Path) -> Path:
    """The newest pipeline run under `workdir` whose evaluate step wrote its outputs."""
    runs = sorted((workdir / "pipeline_root").glob("*/evaluate-plans/executor_output.json"))
    if not runs:
        sys.exit(f"error: no finished pipeline run under {workdir / 'pipeline_root'} (run `make run` first)")
    return runs[-1].parent.parent


def figures(run: Path) -> tuple[list[dict[str, Any]], str]:
    """The run's rows (figure, value, comparison, ratio) and a line naming the task it planned."""
    found = run_figures(run)  # what `shardwise pipeline run --local` prints at its end, read the same way
    task = json.loads((run / "make-task" / "task").read_text())

    def row(figure: str, key: str, against_key: str, against_name: str, fmt: str) -> dict[str, Any]:
        value, against = found[key], found[against_key]
        return {"figure": figure, "value": format(value, fmt), "comparison": against_name,
                "comparison_value": format(against, fmt), "ratio": round(value / against, 3) if against else None}

    mape = "neural_heldout_tables_total_mape_pct"
    rows = [
        row("held-out tables, total fwd+bwd MAPE %", mape, "torchrec_estimator_heldout_tables_total_mape_pct",
            "TorchRec's estimator", ".1f"),
        row("held-out tables, MAPE % against the noise floor (repeats)", mape, "noise_floor_repeats_total_mape_pct",
            "noise floor", ".1f"),
        row("held-out tables, Spearman", "neural_heldout_tables_total_spearman",
            "torchrec_estimator_heldout_tables_total_spearman", "TorchRec's estimator", ".3f"),
        row("plan cost, ms (slowest device, measured)", "method_max_cost_ms", "torchrec_max_cost_ms",
            "TorchRec's planner", ".3f"),
    ]
    if "neural_heldout_row_blocks_total_mape_pct" in found:
        rows.append(row("held-out row blocks (row-wise kernels), MAPE %", "neural_heldout_row_blocks_total_mape_pct",
                        mape, "held-out whole shards", ".2f"))
    if "data_parallel_kernel_line_heldout_dense_kernels_total_mape_pct" in found:
        rows.append(row("held-out dense kernels (data-parallel line), MAPE %",
                        "data_parallel_kernel_line_heldout_dense_kernels_total_mape_pct",
                        "data_parallel_kernel_network_dense_kernels_total_mape_pct", "the compute network", ".2f"))
        # the line: within 2 points of the table-wise kernels' (the whole shards')
        rows.append(row("held-out dense kernels (data-parallel line), MAPE %",
                        "data_parallel_kernel_line_heldout_dense_kernels_total_mape_pct", mape,
                        "held-out whole shards", ".2f"))
    if "noise_floor_dense_kernel_repeats_total_mape_pct" in found:
        rows.append(row("dense kernels' noise floor (repeats), MAPE %",
                        "noise_floor_dense_kernel_repeats_total_mape_pct", "noise_floor_repeats_total_mape_pct",
                        "the shards' noise floor", ".2f"))
    if "refined_max_cost_ms" in found:
        rows.append(row("refined plan cost, ms (measured in the same session)", "refined_max_cost_ms",
                        "torchrec_max_cost_ms", "TorchRec's planner", ".3f"))
        rows.append(row("refined plan cost, ms (evaluate step's session)", "refined_max_cost_ms",
                        "method_max_cost_ms", "the plan it refined", ".3f"))
    if "refinement_after_ms" in found:
        rows.append(row("refined plan, ms (refinement's own paired session)", "refinement_after_ms",
                        "refinement_before_ms", "its start", ".3f"))
    if "method_samples_per_s" in found:
        rows.append(row("DLRM training, samples/s", "method_samples_per_s", "torchrec_samples_per_s",
                        "TorchRec's planner", ",.0f"))
    where = (f"{run.name}: {len(task['tables'])} held-out tables on {task['num_devices']} devices, "
             f"batch {task['batch_size']}; {int(found['train_shards'])} training shards")
    return rows, where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/local", help="the local pipeline's work directory")
    parser.add_argument("--record", action="store_true", help="write a new record under benchmarks/results/make_run/")
    args = parser.parse_args()
    run = latest_run(Path(args.workdir))
    rows, where = figures(run)
    print(where)
    print(f"{'figure':58} {'value':>10} {'comparison':>22} {'':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['figure']:58} {r['value']:>10} {r['comparison']:>22} {r['comparison_value'] or '-':>10} "
              f"{'-' if r['ratio'] is None else format(r['ratio'], '.3f'):>6}")
    if args.record:
        record("make_run", "The main job: `make run`", rows,
               model=f"{run.name}/pretrain-cost-model/model, trained in the run",
               notes=(f"{where}. One run of the local pipeline on CPU (gloo, fbgemm's CPU kernels): the plan and "
                      "throughput ratios move by a few percent between runs (read measurement_noise); DLRM "
                      "training is 10 iterations. `make run`'s wall time on a busy machine: the newcomer record."))


if __name__ == "__main__":
    main()
