"""The page the pipeline hands the Kubeflow UI: self-contained (plots as data URIs), numbers rounded, no local
paths; rendered in headless Chromium where it is installed (Debian's `chromium`)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from shardwise.evaluation import DeviceCost, MeasuredPlanCost, compare_measured
from shardwise.evaluation.refine import Refinement, RefinementRound
from shardwise.evaluation.report import plot_device_costs, plot_plan_comparison, write_plan_report
from shardwise.jobs.evaluate import EvaluateResult, comparison_page


def _cost(method: str, scale: float) -> MeasuredPlanCost:
    devices = tuple(
        DeviceCost(device=d, shards=(f"t{d}", f"t{d + 4}"), width=64, fwd_ms=1.234567891 * scale * (1 + d / 10),
                   bwd_ms=2.3456789123 * scale, comm_fwd_ms=0.31234, comm_bwd_ms=0.41234, memory_bytes=123_456_789,
                   comm_fwd_measured_ms=0.31234, comm_bwd_measured_ms=0.41234)
        for d in range(4)
    )
    return MeasuredPlanCost(method=method, batch_size=2048, device_kind="cpu", hardware_kind="cpu-test",
                            device_memory_bytes=2**30, timing={}, reference_ms=1.0, devices=devices)


def _refinement() -> Refinement:
    return Refinement(rounds=[RefinementRound(round=1, measured_max_ms=8.8011, slowest_device=2, change="t147[0] 2->1",
                                              predicted_max_ms=8.61234, after_ms=8.65512, kept=True),
                              RefinementRound(round=2, measured_max_ms=8.644, slowest_device=1, change="")],
                      starts={"neuroshard": 8.8011, "measured_greedy": 8.9123}, start="neuroshard",
                      before_ms=8.8011, after_ms=8.65512, seconds=36.3, devices_measured=44, stopped="2 rounds done")


@pytest.fixture()
def page(tmp_path) -> str:
    costs = [_cost("neuroshard", 1.0), _cost("torchrec", 1.1)]
    comparison = compare_measured(list(zip(["neuroshard", "torchrec"], costs)))
    paths = [plot_plan_comparison(comparison, tmp_path / "comparison.png"),
             *(plot_device_costs(c, tmp_path / f"{c.method}_cost.png") for c in costs)]
    evaluated = EvaluateResult(names=["neuroshard", "torchrec"], costs=costs, comparison=comparison,
                               paths=[str(p) for p in paths], refinement=_refinement())
    figures = {"method_max_cost_ms": costs[0].max_cost_ms, "torchrec_max_cost_ms": costs[1].max_cost_ms,
               "ratio_to_torchrec": costs[0].max_cost_ms / costs[1].max_cost_ms, "method_samples_per_s": 17395.123}
    html = comparison_page("neuroshard", figures, evaluated)
    assert str(tmp_path) not in html  # no local paths
    (tmp_path / "report.html").write_text(html)
    return html


def test_page_is_self_contained_and_rounded(page):
    assert page.count("data:image/png;base64,") == 3
    assert not re.search(r"\d\.\d{5,}", page.split("data:image")[0])  # no 16-digit floats in the tables
    assert "17,395" in page and "neuroshard vs TorchRec" in page
    assert "DLRM training, samples/s" in page and "method_samples_per_s" not in page  # labels, not keys


def test_page_shows_the_refinement_rounds(page):
    section = page.split("Refinement on this hardware")[1]
    assert "t147[0] 2-&gt;1" in section and "nothing promised a gain" in section
    assert "8.801 -&gt; 8.655 ms" in section and "measured_greedy 8.912 ms" in section


def test_refined_plans_own_report_shows_its_rounds(tmp_path):
    page = write_plan_report(_cost("neuroshard+refine", 1.0), tmp_path, name="refined", refinement=_refinement())[0]
    assert "t147[0] 2-&gt;1" in page.read_text()
    assert "Refinement" not in write_plan_report(_cost("neuroshard", 1.0), tmp_path, name="plain")[0].read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium not installed")
def test_page_renders_in_headless_chromium(page, tmp_path):
    shot = tmp_path / "report.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1280,1600", f"file://{tmp_path / 'report.html'}"],
                   check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 20_000  # a page with tables and three plots, not a blank one
