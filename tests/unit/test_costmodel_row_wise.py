"""The row-wise cost: row blocks as TorchRec lays them out, the kernel on each device's blocks priced by the compute
model, and the collectives priced by a measured reduce-scatter line (fit, held-out error, storage with the model)."""

import json

import numpy as np
import pytest
from search_doubles import FeatureCostModel

from shardwise.costmodel.data_parallel import AllReduceCost, fit_all_reduce, heldout_all_reduce_errors
from shardwise.costmodel.row_wise import (
    ids_bytes,
    output_bytes,
    reduce_scatter_of,
    row_blocks,
    row_wise_cost,
)
from shardwise.workload import TableSpec, row_wise_rows

LINE = AllReduceCost(latency_ms=0.1, hop_ms=0.0, ms_per_mib=2.0, collective="reduce_scatter")
TABLE = TableSpec(name="t", rows=10, dim=16, pooling_factor=10.0, zipf_alpha=1.0)


def test_row_blocks_are_ceil_rows_over_ranks_with_their_share_of_the_lookups():
    assert row_wise_rows(10, 4) == [3, 3, 3, 1]
    assert row_wise_rows(2, 4) == [1, 1, 0, 0]
    blocks = [TABLE.row_block(rank, 4) for rank in range(4)]
    assert [b.name for b in blocks] == ["t[rows 0:3]", "t[rows 3:6]", "t[rows 6:9]", "t[rows 9:10]"]
    assert [b.rows for b in blocks] == [3, 3, 3, 1]
    assert sum(b.pooling_factor for b in blocks) == pytest.approx(TABLE.pooling_factor)
    assert all(b.source == "t" and b.dim == 16 and b.zipf_alpha == 1.0 for b in blocks)
    small = TABLE.model_copy(update={"rows": 2})
    assert small.row_block(2, 4) is None
    assert [len(d) for d in row_blocks([TABLE, small], 4)] == [2, 2, 1, 1]


def test_collective_bytes_are_the_whole_batch_outputs_and_the_local_samples_ids():
    other = TableSpec(name="u", rows=100, dim=32, pooling_factor=2.5)
    assert output_bytes([TABLE, other], 1024) == 1024 * 48 * 4
    assert ids_bytes([TABLE, other], 1024, 4) == 256 * 12.5 * 8
    assert ids_bytes([TABLE], 10, 4) == 3 * 10 * 8  # ceil(10 / 4) samples on the busiest device


def test_row_wise_cost_is_each_devices_block_kernel_plus_the_collectives():
    model = FeatureCostModel()
    with pytest.raises(ValueError, match="no measured reduce-scatter"):
        row_wise_cost(model, [TABLE], 4, 4096)
    model.reduce_scatter = AllReduceCost(0.1, 0.0, 2.0)  # type: ignore[attr-defined]  # an all-reduce's line
    assert reduce_scatter_of(model) is None
    model.reduce_scatter = LINE  # type: ignore[attr-defined]
    cost = row_wise_cost(model, [TABLE], 4, 4096)
    kernel = model.predict_compute([[TABLE.row_block(r, 4)] for r in range(4)])
    np.testing.assert_allclose(np.stack([cost.fwd_ms, cost.bwd_ms], axis=1), kernel)
    out = float(LINE.predict_ms(output_bytes([TABLE], 4096), 4))
    assert (cost.reduce_scatter_ms, cost.all_gather_ms) == pytest.approx((out, out))
    assert cost.ids_ms == pytest.approx(float(LINE.predict_ms(ids_bytes([TABLE], 4096, 4), 4)))
    np.testing.assert_allclose(cost.total_ms, kernel.sum(axis=1) + cost.comm_ms)
    # measured all-gathers and all-to-alls price the gradients and the ids with their own lines
    model.all_gather = AllReduceCost(0.5, 0.0, 1.0, collective="all_gather")  # type: ignore[attr-defined]
    model.all_to_all = AllReduceCost(0.7, 0.0, 1.0, collective="all_to_all")  # type: ignore[attr-defined]
    own = row_wise_cost(model, [TABLE], 4, 4096)
    assert own.reduce_scatter_ms == pytest.approx(out)
    assert own.all_gather_ms == pytest.approx(float(model.all_gather.predict_ms(output_bytes([TABLE], 4096), 4)))
    assert own.ids_ms == pytest.approx(float(model.all_to_all.predict_ms(ids_bytes([TABLE], 4096, 4), 4)))
    # the kernel on a block costs less than on the whole table: fewer lookups and rows
    whole = model.predict_compute([[TABLE]])[0].sum()
    assert (cost.fwd_ms + cost.bwd_ms < whole).all()
    assert row_wise_cost(model, [], 4, 4096).comm_ms == 0.0


def test_a_reduce_scatter_moves_half_an_all_reduces_bytes_and_is_fitted_like_it():
    all_reduce = AllReduceCost(0.1, 0.0, 2.0)
    assert float(LINE.predict_ms(2**20, 4)) == pytest.approx(0.1 + 2.0 * 0.75)
    assert float(all_reduce.predict_ms(2**20, 4)) == pytest.approx(0.1 + 2.0 * 1.5)
    points = [(d, size, float(LINE.predict_ms(size, d))) for d in (2, 4) for size in (4096, 2**16, 2**20, 2**22)]
    fitted = fit_all_reduce(points, collective="reduce_scatter", backend="gloo")
    assert fitted.collective == "reduce_scatter"
    for d, size, ms in points:
        assert float(fitted.predict_ms(size, d)) == pytest.approx(ms, rel=1e-6)
    errors = heldout_all_reduce_errors(points, collective="reduce_scatter")
    assert max(abs(p / m - 1) for _, _, m, p in errors) < 1e-6
    again = AllReduceCost.from_json(json.loads(json.dumps(fitted.to_json())))
    assert again == fitted
    with pytest.raises(ValueError, match="collective 'gather'"):
        AllReduceCost.from_json({**fitted.to_json(), "collective": "gather"})
    assert AllReduceCost.from_json({"latency_ms": 1, "hop_ms": 0, "ms_per_mib": 1}).collective == "all_reduce"
