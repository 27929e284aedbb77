"""pretrain's summary: the held-out error on the costliest tenth of the shards beside MAPE, and the gate's reason."""

from __future__ import annotations

from shardwise.jobs.pretrain import PretrainResult


def _result(**registry) -> PretrainResult:
    return PretrainResult(out="m", hardware_kind="cpu-test", batch_size=512, train_shards=300, heldout_sources=5,
                          metrics={"neural_heldout_tables_total_mape_pct": 5.1, "heldout_top_decile_mape_pct": 10.25},
                          evaluation_table="table", **registry)


def test_summary_names_the_costliest_tenths_error_and_why_the_gate_decided():
    assert "held-out tables: MAPE 5.10%, 10.25% on the costliest tenth of their shards" in _result().summary()
    refused = _result(registered_name="shardwise-cost-cpu-test", registered_version="3", alias="challenger",
                      run_id="r", heldout_mape_pct=5.1, champion_version="2", champion_mape_pct=5.3,
                      heldout_top_decile_mape_pct=10.25, champion_top_decile_mape_pct=9.5,
                      reason="heldout_mape_pct 5.1 < champion v2's 5.3; heldout_top_decile_mape_pct 10.25 > champion "
                             "v2's 9.5: worse than the champion").summary()
    assert ("registered shardwise-cost-cpu-test v3 as 'challenger' (held-out MAPE 5.10% vs champion v2 5.30%, "
            "costliest tenth 10.25% vs 9.50%); run r") in refused
    assert "gate: heldout_mape_pct 5.1 < champion v2's 5.3; heldout_top_decile_mape_pct 10.25 > champion" in refused
