"""A cost model knows what it was trained on: the ranges of its table features, shard sizes and batch are saved
with it, and a task outside them is named in one line, with how far out it lies."""

import json

import pytest
import torch
from costmodel_synthetic import cost_frame, synthetic_tables

from shardwise.costmodel import ModelFileError, NeuralCostModel, TrainConfig, train_cost_model
from shardwise.costmodel.coverage import FeatureRanges
from shardwise.costmodel.features import TableFeatureCache
from shardwise.search import make_searcher
from shardwise.workload import ShardingTask, TableSpec, mlperf_dcnv2_tables

torch.set_num_threads(1)

#: a model profiled on CPU-sized synthetic tables, as `make run` trains one
SEEN = FeatureRanges(rows=(1000.0, 1e6), dim=(4.0, 64.0), pooling_factor=(1.0, 40.0), accesses_per_row=(1.0, 3.0),
                     tables_per_shard=(1.0, 6.0), batch_size=2048)


@pytest.fixture(scope="module")
def trained():
    tables = synthetic_tables("a", 16, 0)
    model, report = train_cost_model(cost_frame({"a": tables}, {"a": 80}, 0),
                                     0, TrainConfig(epochs=5, progress=False))
    return model, report, tables


def test_training_records_the_ranges_of_what_the_model_saw(trained):
    model, report, _ = trained
    ranges = model.meta.feature_ranges
    seen = list(dict.fromkeys(t for s in report.train.shards for t in s))
    assert ranges.dim == (min(t.dim for t in seen), max(t.dim for t in seen))
    assert ranges.rows == pytest.approx((min(t.rows for t in seen), max(t.rows for t in seen)), rel=1e-5)
    assert ranges.pooling_factor == pytest.approx((min(t.pooling_factor for t in seen),
                                                   max(t.pooling_factor for t in seen)), rel=1e-5)
    assert ranges.tables_per_shard == (min(map(len, report.train.shards)), max(map(len, report.train.shards)))
    assert ranges.batch_size == 512 and 1.0 <= ranges.accesses_per_row[0] <= ranges.accesses_per_row[1]
    # its own training tables are inside, at its batch
    assert model.outside_training(seen, 512, [1, int(ranges.tables_per_shard[1])]) is None


def test_the_ranges_are_saved_and_a_v2_model_or_one_without_them_is_refused(trained, tmp_path):
    model, _, _ = trained
    directory = model.save(tmp_path / "m")
    doc = json.loads((directory / "cost_model.json").read_text())
    assert doc["format"] == "shardwise.costmodel/v3"
    assert NeuralCostModel.load(directory).meta.feature_ranges == model.meta.feature_ranges

    older = {**doc, "format": "shardwise.costmodel/v2", "meta": {**doc["meta"]}}
    del older["meta"]["feature_ranges"]
    (directory / "cost_model.json").write_text(json.dumps(older))
    with pytest.raises(ModelFileError, match=r"cost_model.json: a shardwise.costmodel/v2 model, made by an older "
                                             r"shardwise: pretrain again"):
        NeuralCostModel.load(directory)

    (directory / "cost_model.json").write_text(json.dumps({**older, "format": "shardwise.costmodel/v3"}))
    with pytest.raises(ModelFileError, match="missing field 'feature_ranges'"):
        NeuralCostModel.load(directory)

    (directory / "cost_model.json").write_text(json.dumps({**doc, "meta": {**doc["meta"], "feature_ranges": None}}))
    with pytest.raises(ModelFileError, match="field 'feature_ranges' must be an object"):
        NeuralCostModel.load(directory)

    doc["format"] = "shardwise.costmodel/v3"
    doc["meta"]["feature_ranges"] = {**model.meta.feature_ranges.to_json(), "dim": [64, 4]}
    (directory / "cost_model.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="field 'feature_ranges.dim' must be \\[low, high\\]"):
        NeuralCostModel.load(directory)


def test_the_dcnv2_tables_are_named_with_how_far_out_they_lie():
    tables = mlperf_dcnv2_tables(0.001)
    found = SEEN.outside([t.name for t in tables], TableFeatureCache(2048)(tables), 512, [7, 19])
    line = "; ".join(found)
    assert "dim 128 is 2x the largest seen (64): t0, t1, t2, t3 and 22 more" in found
    assert "pooling 100 is 2.5x the largest seen (40): t20" in found
    # the farthest out first: the 2-row tables, 500x under the 1,000 seen
    assert "rows 2 is 500x under the smallest seen (1,000): t5, t7, t8, t12 and 16 more" in found, line
    assert "19 shards on device 1 is 3.2x the most in a profiled shard (6), on 2 device(s)" in found
    assert "batch 512 is not the profiled batch 2048 (predicted ms are at 2048)" in found
    inside = [TableSpec(name="u", rows=5000, dim=32, pooling_factor=4.0)]
    assert SEEN.outside(["u"], TableFeatureCache(2048)(inside), 2048, [3]) == []


def test_planning_outside_the_ranges_says_so_in_the_plan(trained):
    model, report, _ = trained
    seen = list(dict.fromkeys(t for s in report.train.shards for t in s))
    widest = int(model.meta.feature_ranges.dim[1])
    wide = tuple(t.model_copy(update={"dim": 4 * widest}) for t in seen[:3])
    task = ShardingTask(num_devices=3, device_memory_bytes=2**30, batch_size=512, tables=wide + tuple(seen[3:6]))
    plan = make_searcher("size_greedy").search(task, model, 0)
    line = plan.extra["outside_training"]
    assert line == ("outside what the cost model was trained on, its predictions are extrapolated: dim "
                    f"{4 * widest} is 4x the largest seen ({widest}): {', '.join(t.name for t in wide)}")
    inside = ShardingTask(num_devices=2, device_memory_bytes=2**30, batch_size=512, tables=tuple(seen[:4]))
    assert "outside_training" not in make_searcher("size_greedy").search(inside, model, 0).extra


def test_a_task_at_another_batch_is_out_of_range_even_with_familiar_tables(trained):
    model, report, _ = trained
    line = model.outside_training(list(report.train.shards[0]), 2048)
    assert line is not None and "batch 2048 is not the profiled batch 512" in line
