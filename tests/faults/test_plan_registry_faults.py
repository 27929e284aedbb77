"""The plan registry under faults (the same scenarios `python -m benchmarks faults` records): the MLflow tracking
server SIGKILLed while `shardwise publish` registers a plan (the fault asserted to land while it runs: it exits 2
with one error line and no traceback), and two runs registering plans of one task at once. Five tries each, the
fault striking at different moments: the champion never points at a half-logged version or a plan whose files do
not load, a rerun finishes the job, and the faster plan is the champion whatever the order."""

from __future__ import annotations

import re

import pytest
from fault_injection import concurrent_plan_registration, plan_registration_server_killed

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.1, 0.3, 0.6])
def test_a_server_killed_mid_publish_leaves_no_dangling_champion_and_publish_says_so_in_one_line(
        delay_s, mlflow_registry, tmp_path):
    outcome = plan_registration_server_killed(tmp_path, delay_s=delay_s, server=mlflow_registry)
    assert outcome.notes["killed_while_running"] is True, outcome  # the fault landed: publish was still registering
    assert outcome.wrong_champions == 0, outcome
    assert outcome.notes["first_exit"] == 2, outcome  # shardwise publish's own error path, not a crash
    assert outcome.notes["traceback"] is False and outcome.notes["error_lines"] == 1, outcome
    assert outcome.error.startswith("shardwise publish: error: "), outcome.error
    assert re.search("stopped answering|did not answer|unreachable", outcome.error), outcome.error
    assert outcome.notes["rerun_exit"] == 0, outcome.notes


@pytest.mark.parametrize("ms, offsets_s", [((5.0, 3.0), (0.0, 0.3)), ((3.0, 5.0), (0.0, 0.3)),
                                           ((5.0, 3.0), (0.0, 0.0)), ((3.0, 5.0), (0.0, 0.0)),
                                           ((5.0, 3.0), (0.3, 0.0))])
def test_two_runs_registering_plans_at_once_leave_the_faster_plan_champion(ms, offsets_s, mlflow_registry, tmp_path):
    outcome = concurrent_plan_registration(tmp_path, ms=ms, offsets_s=offsets_s, server=mlflow_registry)
    assert outcome.wrong_champions == 0, outcome
    assert float(str(outcome.notes["champion_ms"])) == min(ms)
