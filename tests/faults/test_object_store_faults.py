"""The object store stopped while `profile --out s3://...` writes (moto's S3 server on loopback, stopped between
two part writes and started again on the same port): every part already written stays, the error says how many
rows are safe, and the rerun measures only the rest; none lost, none twice."""

from __future__ import annotations

import re

import pytest
from fault_injection import profile_store_stopped

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_store_stopped_mid_profile_loses_no_row_and_the_rerun_measures_only_the_rest(tmp_path):
    outcome = profile_store_stopped(tmp_path, num_shards=60, stop_before_row=50)
    assert outcome.notes["first_exit"] == 2, outcome
    # one line naming the store, how many rows are safe (the parts written before it stopped), and what to do
    assert "the object store at http://127.0.0.1:" in outcome.error and "unreachable" in outcome.error
    safe = re.search(r"(\d+) rows are safe in s3://shardwise-costs/costs/[\w-]+ ", outcome.error)
    assert safe and int(safe[1]) == outcome.notes["rows_when_stopped"] > 0, outcome.error
    assert "rerun the same command" in outcome.error
    assert outcome.seconds_to_error is not None and outcome.seconds_to_error < 10, outcome
    # the rerun measured only what was not stored, and the dataset is the fault-free run's, row for row
    assert outcome.notes["rerun_exit"] == 0, outcome.notes
    assert f" {safe[1]} already stored," in str(outcome.notes["rerun"]), outcome.notes["rerun"]
    assert outcome.rows_lost == 0 and outcome.duplicated_rows == 0, outcome
