"""`shardwise pipeline run --local` SIGKILLed (the run and every step process) in a step, then run again with the
same arguments: the rerun takes the steps that finished from the cache (kfp.local's, in the work directory, keyed
by the steps' inputs and shardwise's code), runs the rest, and the cost rows it pre-trains on are a fault-free
run's, none missing and none twice. A kill while the first step that logs makes the MLflow store (a new sqlite
file) leaves no half-made store for the rerun to trip on."""

from __future__ import annotations

import pytest
from fault_injection import (
    half_made_store,
    pipeline_killed,
    store_creation_killed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


#: the steps that store cost rows: the smoke preset's two profiling workers, then the all-to-alls
PROFILING_STEPS = 3


@pytest.fixture(scope="module")
def killed_last(tmp_path_factory):
    """A run killed in its last step (evaluate-plans), then run again. Every profiling step had finished before the
    kill and no fault reached one: the rows they stored, read at the kill, are a fault-free run's (the reference
    for the runs killed earlier; a run of its own to make it took as long as a whole pipeline)."""
    outcome = pipeline_killed(tmp_path_factory.mktemp("evaluate-plans"), step="evaluate-plans", delay_s=2.0)
    assert outcome.notes["profile_steps_finished_before_kill"] == PROFILING_STEPS, outcome.notes
    assert outcome.rows_at_kill, outcome.notes
    return outcome


@pytest.mark.parametrize("step, delay_s, at_store_creation", [
    ("profile-costs", 3.0, False),
    # after the model is registered: the rerun takes pre-training from the cache too (its cache key once held the
    # local run's id, new on every run, so everything after it ran again)
    ("evaluate-plans", 2.0, False),
    # 1 s into the MLflow store's making (2-3 s here): before it was made whole, the rerun's pretrain step found
    # a half-made store and failed ("table latest_metrics already exists"), and the rerun exited 2
    ("pretrain-cost-model", 1.0, True),
])
def test_a_run_killed_in_a_step_resumes_with_what_finished_and_loses_no_row(step, delay_s, at_store_creation,
                                                                            killed_last, tmp_path):
    fault_free = killed_last.rows_at_kill
    assert fault_free is not None
    if step == "evaluate-plans":  # the module's run: after its rerun, the rows it had stored at the kill, exactly
        outcome = killed_last
        assert outcome.notes["rows"] == sum(fault_free.values()), outcome.notes
    else:
        outcome = pipeline_killed(tmp_path, step=step, delay_s=delay_s, expected=fault_free,
                                  at_store_creation=at_store_creation)
    assert outcome.notes["rerun_exit"] == 0, outcome
    assert outcome.notes["finished_before_kill"], outcome.notes  # the kill came after some steps finished
    assert outcome.notes["code_versions"] == 1, "shardwise's source changed between the kill and the rerun"
    assert outcome.notes["ran_again"] == [], outcome.notes  # what finished was taken, not run again
    assert outcome.rows_lost == 0 and outcome.duplicated_rows == 0, outcome
    assert sum(fault_free.values()) > 0


def test_a_process_killed_while_making_the_mlflow_store_leaves_none_half_made(tmp_path):
    outcome = store_creation_killed(tmp_path)
    # the kill came in MLflow's migrations: the store's name is not taken by a half-made schema
    assert "mlflow.db" not in outcome.notes["store_after_kill"], outcome.notes
    assert outcome.notes["rerun_exit"] == 0, outcome  # the next process makes it and logs to it


def test_a_store_an_older_kill_left_half_made_is_named_so_with_what_to_do(tmp_path):
    from shardwise.integrations.mlflow import MlflowService, StoreError

    uri = half_made_store(tmp_path)
    with pytest.raises(StoreError, match="its tables are half made .*move it aside and run again"):
        MlflowService(uri).log_run(experiment="after", run_name="after", params={}, metrics={})
