"""Reports: the HTML pages hold the per-device and comparison tables; the PNGs are real images."""

from __future__ import annotations

from shardwise.evaluation.measured import DeviceCost, MeasuredPlanCost
from shardwise.evaluation.report import write_benchmark_report, write_plan_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cost() -> MeasuredPlanCost:
    devices = tuple(
        DeviceCost(device=d, shards=(f"t{d}",), width=16 * (d + 1), fwd_ms=1.0 + d, bwd_ms=2.0 + d,
                   comm_fwd_ms=0.25, comm_bwd_ms=0.5, memory_bytes=(d + 1) * 2**20, comm_fwd_measured_ms=0.25,
                   comm_bwd_measured_ms=0.5)
        for d in range(3)
    )
    return MeasuredPlanCost(method="size_greedy", batch_size=512, device_kind="cpu", hardware_kind="cpu-test",
                            device_memory_bytes=4 * 2**20, devices=devices)


def test_plan_report_holds_the_per_device_table_and_plots(tmp_path) -> None:
    page, cost_png, memory_png = write_plan_report(_cost(), tmp_path, name="p", predicted_total_ms=[4.0, 6.0, 8.0])
    html = page.read_text()
    assert page.name == "p.html" and "src='p_cost.png'" in html and "src='p_memory.png'" in html
    # device 2: 3 + 4 + 0.25 + 0.5 ms, 3 MiB
    assert "<td>2</td><td>1</td><td>48</td><td>3.000</td><td>4.000</td><td>0.250</td><td>0.500</td><td>7.750</td>" in html
    assert "plan cost (slowest device) <b>7.750 ms</b>" in html and "predicted ms" in html
    for png in (cost_png, memory_png):
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000


def test_plan_report_shows_the_cost_models_error_on_the_costliest_shards_and_the_slowest_device(tmp_path) -> None:
    figures = {"heldout_mape_pct": 5.1, "heldout_top_decile_mape_pct": 9.87, "seed": 0}
    (page, *_) = write_plan_report(_cost(), tmp_path, name="p", predicted_total_ms=[4.0, 6.0, 6.975],
                                   cost_model_figures=figures)
    html = page.read_text()
    assert ("<h2>Cost model</h2><p>held-out MAPE 5.10%; on the costliest tenth of the held-out shards 9.87%; the "
            "slowest device (device 2) predicted 6.975 ms, measured 7.750 ms (-10.0%)</p>") in html
    # a model without the figures (an older one) still shows the slowest device; without predictions, nothing
    (older, *_) = write_plan_report(_cost(), tmp_path, name="o", predicted_total_ms=[4.0, 6.0, 8.0],
                                    cost_model_figures={"seed": 0})
    assert "Cost model</h2><p>the slowest device (device 2) predicted 8.000 ms" in older.read_text()
    (bare, *_) = write_plan_report(_cost(), tmp_path, name="b")
    assert "Cost model" not in bare.read_text()


def test_benchmark_report_holds_the_method_comparison(tmp_path) -> None:
    rows = [
        {"task_set": "4dev", "method": m, "tasks": 2, "failed": 0, "mean_cost_ms": c, "mean_compute_ms": c / 2, "ratio_to_torchrec": c / 10.0,
         "ratio_to_best_baseline": c / 8.0, "best_baseline": "size_greedy", "imbalance": 1.2,
         "memory_headroom": 0.1, "planning_time_s": 0.5, "prediction_error": None}
        for m, c in (("torchrec", 10.0), ("size_greedy", 8.0), ("neuroshard", 6.0))
    ]
    page, png = write_benchmark_report(rows, tmp_path, plan_reports=[("4dev task 0 neuroshard", "x/neuroshard.html")])
    html = page.read_text()
    assert "<td class='text'>4dev</td><td class='text'>neuroshard</td><td>2</td><td>0</td><td>6.000</td><td>3.000</td><td>0.600</td><td>0.750</td>" in html
    assert "href='x/neuroshard.html'" in html
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_benchmark_report_shows_throughput_columns_only_when_measured(tmp_path) -> None:
    rows = [
        {"task_set": "4dev", "method": m, "tasks": 1, "failed": 0, "mean_cost_ms": 5.0, "mean_compute_ms": 2.5,
         "ratio_to_torchrec": 1.0, "ratio_to_best_baseline": 1.0, "best_baseline": "torchrec", "imbalance": 1.0,
         "memory_headroom": 0.1, "planning_time_s": 0.5, "prediction_error": None}
        for m in ("torchrec", "neuroshard")
    ]
    page, _ = write_benchmark_report(rows, tmp_path / "off")
    assert "mean_samples_per_s" not in page.read_text()
    for row, samples_per_s in zip(rows, (1000.0, 1250.0)):
        row.update(mean_samples_per_s=samples_per_s, throughput_ratio_to_torchrec=samples_per_s / 1000.0)
    html = write_benchmark_report(rows, tmp_path / "on")[0].read_text()
    assert "<th>mean_samples_per_s</th><th>throughput_ratio_to_torchrec</th>" in html
    assert "<td>-</td><td>1250.000</td><td>1.250</td></tr>" in html  # after prediction_error (none)
