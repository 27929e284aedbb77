"""Reports: per-plan and per-benchmark HTML pages with PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from shardwise.extras import import_extra
from shardwise.search.bottleneck import bottleneck_line, slowest_alone

from .measured_records import DLRMThroughput, MeasuredPlanCost, PlanComparison, describe_comm_pricing

if TYPE_CHECKING:
    from .refine_record import Refinement

GIB = 2**30
_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}th{background:#eee}"
    "td:first-child,th:first-child,td.text{text-align:left}img{max-width:48%;margin:0.5%}"
)
#: a cell that reads as a number (right-aligned); anything else is text (left-aligned)
_NUMBER = re.compile(r"^[-+]?[\d,.]+(%|x)?$|^-$")


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only: no display on servers and CI), imported on the first
    plot: matplotlib is the `[report]` extra, and jobs import this module before they know they will plot."""
    import_extra("matplotlib").use("Agg")
    return import_extra("matplotlib.pyplot")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(_fmt(c)) for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(text: str) -> str:
    return f"<td>{html.escape(text)}</td>" if _NUMBER.match(text) else f"<td class='text'>{html.escape(text)}</td>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def plot_device_costs(
    cost: MeasuredPlanCost, path: Path, predicted_total_ms: Sequence[float] | None = None
) -> Path:
    """Per-device stacked bars: forward, backward, communication ms (predicted totals as markers)."""
    devices = [d.device for d in cost.devices]
    fwd = [d.fwd_ms for d in cost.devices]
    bwd = [d.bwd_ms for d in cost.devices]
    comm = [d.comm_ms for d in cost.devices]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7.0, 0.6 * len(devices) + 4.5), 3.8))
    ax.bar(devices, fwd, label="forward", color="#4c72b0")
    ax.bar(devices, bwd, bottom=fwd, label="backward", color="#dd8452")
    ax.bar(devices, comm, bottom=[f + b for f, b in zip(fwd, bwd)], label="all-to-all", color="#55a868")
    if predicted_total_ms is not None:
        ax.scatter(devices, predicted_total_ms, marker="_", s=600, color="k", zorder=3, label="predicted total")
    ax.axhline(cost.max_cost_ms, color="#c44e52", linestyle="--", linewidth=1, label="plan cost (max)")
    ax.set_xlabel("device")
    ax.set_ylabel("ms per iteration")
    ax.set_xticks(devices)
    ax.set_title(f"{cost.method}: measured cost per device (imbalance {cost.imbalance:.2f})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides a bar
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_device_memory(cost: MeasuredPlanCost, path: Path) -> Path:
    """Per-device memory (GiB) against the per-device cap."""
    devices = [d.device for d in cost.devices]
    unit, scale = ("GiB", GIB) if cost.device_memory_bytes >= GIB else ("MiB", 2**20)
    memory = [d.memory_bytes / scale for d in cost.devices]
    cap = cost.device_memory_bytes / scale
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7.0, 0.6 * len(devices) + 4.5), 3.8))
    colors = ["#c44e52" if m > cap else "#8172b3" for m in memory]
    ax.bar(devices, memory, color=colors, label="weights + optimizer\nstate + buffers")
    ax.axhline(cap, color="k", linestyle="--", linewidth=1, label=f"cap {cap:.4g} {unit}")
    ax.set_xlabel("device")
    ax.set_ylabel(unit)
    ax.set_xticks(devices)
    ax.set_ylim(0, max(cap, max(memory)) * 1.15)
    ax.set_title(f"{cost.method}: memory per device (headroom {cost.memory_headroom:.0%})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def device_rows(cost: MeasuredPlanCost, predicted_total_ms: Sequence[float] | None = None) -> list[list[Any]]:
    """The per-device table rows shown in reports."""
    rows = []
    for i, d in enumerate(cost.devices):
        row: list[Any] = [
            d.device, len(d.shards), d.width, d.fwd_ms, d.bwd_ms, d.comm_fwd_ms, d.comm_bwd_ms, d.total_ms,
            d.memory_bytes / 2**20,
        ]
        if predicted_total_ms is not None:
            row.append(float(predicted_total_ms[i]))
        rows.append(row)
    return rows


def measured_bottleneck(cost: MeasuredPlanCost) -> dict[str, Any] | None:
    """`search.bottleneck.slowest_alone` on measured ms: where the measured slowest device holds one shard alone
    (its data-parallel replicas and row-wise blocks, on every device, not counted)."""
    everywhere = set(cost.data_parallel) | set(cost.row_wise)
    shards = [[name for name in d.shards if name.split("[", 1)[0] not in everywhere] for d in cost.devices]
    return slowest_alone(shards, [d.total_ms for d in cost.devices], kind="measured")


def _bottleneck_html(cost: MeasuredPlanCost) -> str:
    """`measured_bottleneck`'s line as a paragraph; empty where the slowest device holds more than one shard."""
    alone = measured_bottleneck(cost)
    return f"<p>{html.escape(bottleneck_line(alone))}</p>" if alone else ""


DEVICE_HEADER = (
    "device", "shards", "width", "fwd ms", "bwd ms", "a2a fwd ms", "a2a bwd ms", "total ms", "memory MiB"
)


def summary_page(
    title: str,
    intro: str,
    figures: Sequence[tuple[str, str]],
    named_costs: Sequence[tuple[str, MeasuredPlanCost]],
    images: Sequence[str | Path],
    refinement: Refinement | None = None,
) -> str:
    """A self-contained page (what the pipeline hands the Kubeflow UI): the figures (label, value as shown), the
    plots embedded as data URIs, the refinement's rounds, and each plan's per-device table; no file paths."""
    plots = "".join(
        f"<img alt='{html.escape(Path(p).stem)}' src='data:image/png;base64,"
        f"{base64.b64encode(Path(p).read_bytes()).decode()}'>"
        for p in images
    )
    per_plan = "".join(
        f"<h2>{html.escape(name)}: measured per device (plan cost {cost.max_cost_ms:.3f} ms, "
        f"imbalance {cost.imbalance:.3f})</h2>" + _bottleneck_html(cost) + _table(DEVICE_HEADER, device_rows(cost))
        for name, cost in named_costs
    )
    body = f"<p>{html.escape(intro)}</p>" + _table(("figure", "value"), figures) + plots
    return _page(title, body + (refinement_section(refinement) if refinement else "") + per_plan)


def refinement_section(refinement: Refinement) -> str:
    """Refinement on the hardware as a report shows it: the starts it measured, each round (the slowest device
    measured, what moved, the corrected prediction and the measurement after), and how it ended."""
    starts = ", ".join(f"{html.escape(m)} {ms:.3f} ms" for m, ms in refinement.starts.items())
    intro = (
        f"<p>Every device measured, kernels and all-to-alls; refined from <b>{html.escape(refinement.start)}</b>"
        + (f" (starts measured side by side: {starts})" if len(refinement.starts) > 1 else "")
        + f"; {html.escape(refinement.outcome())}. A change is kept only when it measured faster.</p>"
    )
    rows = [
        [r.round, r.measured_max_ms, r.slowest_device, r.described,
         "-" if r.predicted_max_ms is None else r.predicted_max_ms, "-" if r.after_ms is None else r.after_ms,
         "yes" if r.kept else "no"]
        for r in refinement.rounds
    ]
    header = ("round", "slowest device, ms", "device", "change", "predicted after, ms", "measured after, ms", "kept")
    return "<h2>Refinement on this hardware</h2>" + intro + _table(header, rows)


#: a cost model's held-out figures (`cost_model.json`'s info) a plan's report shows: key, label
COST_MODEL_FIGURES = (("heldout_mape_pct", "held-out MAPE"),
                      ("heldout_top_decile_mape_pct", "on the costliest tenth of the held-out shards"))


def cost_model_section(cost: MeasuredPlanCost, predicted_total_ms: Sequence[float] | None,
                       figures: Mapping[str, Any] | None = None) -> str:
    """The cost model that priced the plan: its held-out MAPE, overall and on the costliest tenth of the held-out
    shards (what the slowest device's error is like), and on this plan the measured slowest device's predicted ms
    against its measured ms; empty where there is neither."""
    shown = [f"{label} {figures[key]:.2f}%" for key, label in COST_MODEL_FIGURES
             if figures and isinstance(figures.get(key), int | float)]
    if predicted_total_ms is not None and cost.devices:
        slowest = max(range(len(cost.devices)), key=lambda i: cost.devices[i].total_ms)
        measured, predicted = cost.devices[slowest].total_ms, float(predicted_total_ms[slowest])
        error = f" ({predicted / measured - 1:+.1%})" if measured > 0 else ""
        shown.append(f"the slowest device (device {cost.devices[slowest].device}) predicted {predicted:.3f} ms, "
                     f"measured {measured:.3f} ms{error}")
    return f"<h2>Cost model</h2><p>{html.escape('; '.join(shown))}</p>" if shown else ""


def write_plan_report(
    cost: MeasuredPlanCost,
    out_dir: str | Path,
    *,
    name: str = "plan",
    predicted_total_ms: Sequence[float] | None = None,
    throughput: Sequence[DLRMThroughput] = (),
    refinement: Refinement | None = None,
    cost_model_figures: Mapping[str, Any] | None = None,
) -> list[Path]:
    """`<name>.html` with the per-device table and plots `<name>_cost.png`, `<name>_memory.png` (and the rounds
    of the refinement that made the plan, and the cost model's figures, `cost_model_section`); returns paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cost_png = plot_device_costs(cost, out / f"{name}_cost.png", predicted_total_ms)
    memory_png = plot_device_memory(cost, out / f"{name}_memory.png")
    header = list(DEVICE_HEADER) + (["predicted ms"] if predicted_total_ms is not None else [])
    summary = (
        f"<p>plan cost (slowest device) <b>{cost.max_cost_ms:.3f} ms</b>, mean {cost.mean_cost_ms:.3f} ms, "
        f"imbalance {cost.imbalance:.3f}, memory headroom {cost.memory_headroom:.1%}; batch {cost.batch_size}, "
        f"hardware {html.escape(cost.hardware_kind)}, reference_ms "
        f"{'-' if cost.reference_ms is None else format(cost.reference_ms, '.4f')}; "
        f"{describe_comm_pricing(cost.comm_pricing)}</p>"
    )
    body = summary + _bottleneck_html(cost) + _table(header, device_rows(cost, predicted_total_ms))
    body += f"<img src='{cost_png.name}' alt='cost per device'><img src='{memory_png.name}' alt='memory per device'>"
    body += cost_model_section(cost, predicted_total_ms, cost_model_figures)
    if refinement:
        body += refinement_section(refinement)
    if throughput:
        body += "<h2>End-to-end DLRM training</h2>" + _table(
            ("plan", "samples/s", "median iteration ms", "ranks", "backend", "global batch"),
            [
                (t.method, t.samples_per_s, t.median_iter_ms, t.world_size, t.backend, t.global_batch_size)
                for t in throughput
            ],
        )
    page = out / f"{name}.html"
    page.write_text(_page(f"shardwise plan report: {cost.method}", body))
    return [page, cost_png, memory_png]


def plot_method_comparison(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Grouped bars: mean measured plan cost per method, one group per task set."""
    task_sets = sorted({r["task_set"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(task_sets), figsize=(5.5 * len(task_sets), 4.2), squeeze=False)
    for ax, task_set in zip(axes[0], task_sets):
        values = {r["method"]: r for r in rows if r["task_set"] == task_set and r["mean_cost_ms"] is not None}
        names = [m for m in methods if m in values]
        means = [values[m]["mean_cost_ms"] for m in names]
        ax.bar(range(len(names)), means, color="#4c72b0")
        for i, m in enumerate(names):
            ratio = values[m].get("ratio_to_torchrec")
            if ratio is not None:
                ax.text(i, means[i], f"{ratio:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.set_ylabel("mean measured plan cost, ms")
        ax.set_title(f"{task_set} (labels: ratio to torchrec)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


COMPARISON_COLUMNS = (
    "task_set", "method", "tasks", "failed", "mean_cost_ms", "mean_compute_ms", "ratio_to_torchrec", "ratio_to_best_baseline",
    "best_baseline", "imbalance", "memory_headroom", "planning_time_s", "prediction_error",
)
#: shown after COMPARISON_COLUMNS when the benchmark trained the DLRM under the plans (--throughput-tasks)
THROUGHPUT_COLUMNS = ("mean_samples_per_s", "throughput_ratio_to_torchrec")


def write_benchmark_report(
    rows: Sequence[dict[str, Any]],
    out_dir: str | Path,
    *,
    plan_reports: Sequence[tuple[str, str]] = (),
    title: str = "shardwise benchmark",
) -> list[Path]:
    """`benchmark.html` with the method comparison table and `benchmark_methods.png`; links to plan reports."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_method_comparison(rows, out / "benchmark_methods.png")
    throughput = any(THROUGHPUT_COLUMNS[0] in r for r in rows)
    columns = COMPARISON_COLUMNS + (THROUGHPUT_COLUMNS if throughput else ())
    table_rows = [[r.get(c) if r.get(c) is not None else "-" for c in columns] for r in rows]
    body = (
        "<p>Measured on real kernels and all-to-all; plan cost is the slowest device's forward + backward + "
        "all-to-all ms; ratios below 1 beat the reference; prediction error is |predicted - measured| / measured "
        "of the plan cost.</p>"
        + (
            "<p>mean_samples_per_s: end-to-end training throughput of TorchRec's DLRM sharded by each plan "
            "(DistributedModelParallel, one process per device, warm-up excluded), every method's plan of a task "
            "trained in the same run; throughput_ratio_to_torchrec is over the tasks both were trained on, "
            "above 1 beats TorchRec's plan.</p>"
            if throughput else ""
        )
        + _table(columns, table_rows)
        + f"<img src='{png.name}' alt='method comparison' style='max-width:98%'>"
    )
    if plan_reports:
        body += "<h2>Plans</h2><ul>" + "".join(
            f"<li><a href='{html.escape(href)}'>{html.escape(label)}</a></li>" for label, href in plan_reports
        ) + "</ul>"
    page = out / "benchmark.html"
    page.write_text(_page(title, body))
    return [page, png]


def plot_plan_comparison(comparison: PlanComparison, path: Path) -> Path:
    """One bar per plan: the slowest device's kernel and all-to-all ms (predicted plan cost as a marker)."""
    names = [r.name for r in comparison.plans]
    x = list(range(len(names)))
    # the slowest device's total is not always max compute + max comm: show the total, split by the shares
    compute = [min(r.max_compute_ms, r.max_cost_ms) for r in comparison.plans]
    rest = [r.max_cost_ms - c for r, c in zip(comparison.plans, compute)]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names) + 4.0), 3.8))
    ax.bar(x, compute, color="#4c72b0", label="slowest kernel (fwd + bwd)")
    ax.bar(x, rest, bottom=compute, color="#55a868", label="rest of slowest device\n(all-to-all)")
    predicted = [(i, r.predicted_max_cost_ms) for i, r in enumerate(comparison.plans) if r.predicted_max_cost_ms]
    if predicted:
        ax.scatter([i for i, _ in predicted], [v for _, v in predicted], marker="_", s=600, color="k", zorder=3,
                   label="predicted plan cost")
    for i, r in enumerate(comparison.plans):
        ax.text(i, r.max_cost_ms, f"{r.ratio_to_first:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("plan cost, ms per iteration")
    ax.set_title("measured in one session (labels: cost relative to the first plan)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


COMPARISON_HEADER = (
    "plan", "method", "plan cost ms", "slowest kernel ms", "slowest a2a ms", "mean device ms", "imbalance",
    "memory headroom", "cost / first plan", "predicted ms",
)


def write_comparison_report(comparison: PlanComparison, out_dir: str | Path) -> list[Path]:
    """`comparison.html` + `comparison.png` for plans measured together; links each plan's own report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_plan_comparison(comparison, out / "comparison.png")
    rows = [
        [r.name, r.method, r.max_cost_ms, r.max_compute_ms, r.max_comm_ms, r.mean_cost_ms, r.imbalance,
         f"{r.memory_headroom:.1%}", r.ratio_to_first, "-" if r.predicted_max_cost_ms is None else r.predicted_max_cost_ms]
        for r in comparison.plans
    ]
    ref = "-" if comparison.reference_ms is None else f"{comparison.reference_ms:.4f}"
    body = (
        f"<p>All plans were measured in one session: one reference timing (reference_ms {ref}), every shard "
        f"timed in {comparison.compute_rounds} interleaved rounds, one all-to-all process group with the plans' "
        f"layouts taking turns exchange by exchange, {comparison.comm_rounds * comparison.comm_iters} each (medians "
        f"per device; {describe_comm_pricing(comparison.comm_pricing)}); batch {comparison.batch_size}, hardware "
        f"{html.escape(comparison.hardware_kind)}. Plan cost is the slowest device's forward + backward + "
        "all-to-all ms.</p>"
        + _table(COMPARISON_HEADER, rows)
        + f"<img src='{png.name}' alt='plan comparison' style='max-width:70%'>"
        + "<h2>Per plan</h2><ul>"
        + "".join(
            f"<li><a href='{html.escape(r.name)}.html'>{html.escape(r.name)}</a> ({html.escape(r.method)})</li>"
            for r in comparison.plans
        )
        + "</ul>"
        + "".join(f"<img src='{html.escape(r.name)}_cost.png' alt='{html.escape(r.name)}'>" for r in comparison.plans)
    )
    page = out / "comparison.html"
    page.write_text(_page("shardwise: plans measured together", body))
    return [page, png]
