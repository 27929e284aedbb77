"""The MLflow tracking server SIGKILLed while `pretrain` or `train-policy` registers a version (a real `mlflow
server`, killed once the version appears in its store and started again on the same port with the same store),
and two runs registering to one registry at once: the champion is never moved to a half-logged version, the
error is one line within the service timeout, a rerun finishes the job, and the better model by the gate's metric
is the champion whatever the order."""

from __future__ import annotations

import re

import pytest
from fault_injection import concurrent_registration, registration_server_killed

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def registry(mlflow_registry):
    """The run's shared `mlflow server` (conftest), killed and started again by the tests that fault it (each test
    registers under a hardware kind of its own)."""
    return mlflow_registry


@pytest.mark.parametrize("verb, delay_s", [("pretrain", 0.0), ("pretrain", 0.3), ("train-policy", 0.0)])
def test_a_server_killed_mid_registration_keeps_the_champion_and_a_rerun_finishes(verb, delay_s, registry,
                                                                                   tmp_path):
    outcome = registration_server_killed(tmp_path, verb=verb, delay_s=delay_s, server=registry)
    # no alias on a version the gate did not finish; the champion before stays unless the new one is whole
    assert outcome.wrong_champions == 0, outcome
    if outcome.notes["killed_while_running"] and outcome.notes["first_exit"] == 0:
        # its registration had ended before the kill reached it: then the new version is whole (counted above)
        assert outcome.notes["registered_before_the_kill"], outcome
    elif outcome.notes["killed_while_running"]:
        assert outcome.notes["first_exit"] == 2, outcome
        assert outcome.error.count("\n") == 0, outcome.error
        assert re.search("stopped answering|did not answer|unreachable", outcome.error), outcome.error
        assert "127.0.0.1:" in outcome.error
        assert outcome.seconds_to_error is not None and outcome.seconds_to_error < 10, outcome
    assert outcome.notes["rerun_exit"] == 0, outcome.notes


@pytest.mark.parametrize("costs, offsets_s", [((5.0, 3.0), (0.0, 0.3)), ((3.0, 5.0), (0.0, 0.3)),
                                              ((5.0, 3.0), (0.0, 0.0))])
def test_two_runs_registering_at_once_leave_the_better_model_champion(costs, offsets_s, registry, tmp_path):
    outcome = concurrent_registration(tmp_path, costs=costs, offsets_s=offsets_s, server=registry)
    assert outcome.wrong_champions == 0, outcome
    assert float(str(outcome.notes["champion_cost"])) == min(costs)
