import json

import numpy as np
import pytest
import torch
from costmodel_synthetic import cost_frame, synthetic_tables

from shardwise.costmodel import CostModel, ModelFileError, NeuralCostModel, TrainConfig, train_cost_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(fitted_cost_model):
    """The session's fitted model (conftest), trained once for this module and the searches that use it."""
    return fitted_cost_model


def test_implements_the_cost_model_protocol(trained):
    model, _ = trained
    assert isinstance(model, CostModel)
    assert model.hardware_kind == "cpu-test" and model.batch_size == 512


def test_predict_compute_equals_head_of_summed_embeddings(trained):
    model, report = trained
    shards = [list(s) for s in report.test.shards[:20]] + [[]]
    direct = model.predict_compute(shards)
    summed = np.stack([model.table_embeddings(s).sum(axis=0) if s else
                       np.zeros(model.compute_net.embedding_dim, dtype=np.float32) for s in shards])
    np.testing.assert_allclose(model.compute_from_embeddings(summed), direct, rtol=1e-5)
    assert direct.shape == (21, 2) and np.all(direct[:-1] > 0)
    np.testing.assert_array_equal(direct[-1], [0.0, 0.0])


def test_batched_prediction_matches_one_shard_at_a_time(trained):
    model, report = trained
    shards = [list(s) for s in report.test.shards[:15]]
    one_by_one = np.concatenate([model.predict_compute([s]) for s in shards])
    np.testing.assert_allclose(model.predict_compute(shards), one_by_one, rtol=1e-5)


def test_more_tables_cost_more(trained):
    model, report = trained
    tables = list(report.test.shards[0]) + [t for s in report.test.shards for t in s]
    tables = list(dict.fromkeys(tables))[:6]
    costs = model.predict_compute([tables[:k] for k in range(1, 7)]).sum(axis=1)
    assert costs[-1] > costs[0]


def test_save_load_round_trip_gives_identical_predictions(trained, tmp_path):
    model, report = trained
    model.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["cost_model.json", "weights.pt"]
    loaded = NeuralCostModel.load(tmp_path / "m")
    shards = [list(s) for s in report.test.shards]
    np.testing.assert_array_equal(loaded.predict_compute(shards), model.predict_compute(shards))
    widths = np.array([[64, 128, 0, 32]])
    compute = np.array([[1.0, 2.0, 0.0, 0.5]])
    np.testing.assert_array_equal(loaded.predict_comm(widths, compute), model.predict_comm(widths, compute))
    assert loaded.meta == model.meta


def test_subnormal_weights_are_zeroed_on_load(trained, tmp_path):
    model, report = trained
    model.save(tmp_path / "m")
    weights = torch.load(tmp_path / "m" / "weights.pt", weights_only=True)
    # what weight decay leaves behind: weights below float32's normal range (slow on many CPUs)
    name = next(k for k in weights if k.startswith("compute.") and k.endswith("weight"))
    weights[name].view(-1)[:50] = 0.0
    torch.save(weights, tmp_path / "m" / "weights.pt")
    zeros = NeuralCostModel.load(tmp_path / "m")
    weights[name].view(-1)[:50] = torch.finfo(torch.float32).tiny / 4
    torch.save(weights, tmp_path / "m" / "weights.pt")
    loaded = NeuralCostModel.load(tmp_path / "m")
    tiny = torch.finfo(torch.float32).tiny
    for net in (loaded.compute_net, loaded.comm_net):
        for param in net.parameters():
            assert not ((param != 0) & (param.abs() < tiny)).any()
    assert float(loaded.compute_net.state_dict()[name[len("compute."):]].view(-1)[:50].abs().sum()) == 0
    shards = [list(s) for s in report.test.shards]
    np.testing.assert_array_equal(loaded.predict_compute(shards), zeros.predict_compute(shards))


def test_load_refuses_a_directory_without_a_model(tmp_path):
    with pytest.raises(ModelFileError, match="cost_model.json"):
        NeuralCostModel.load(tmp_path)
    (tmp_path / "cost_model.json").write_text('{"format": "other"}')
    with pytest.raises(ModelFileError, match="field 'format'"):
        NeuralCostModel.load(tmp_path)


def _nan_first_weight(d):
    tensors = torch.load(d / "weights.pt")
    next(iter(tensors.values()))[0] = float("nan")
    torch.save(tensors, d / "weights.pt")


def _drop_tensor(d):
    tensors = torch.load(d / "weights.pt")
    del tensors[sorted(tensors)[-1]]
    torch.save(tensors, d / "weights.pt")


def _edit_config(edit):
    def apply(d):
        doc = json.loads((d / "cost_model.json").read_text())
        edit(doc)
        (d / "cost_model.json").write_text(json.dumps(doc))
    return apply


def _short_normaliser(doc):
    for key in ("names", "mean", "std"):
        doc["normaliser"][key] = doc["normaliser"][key][:-1]


@pytest.mark.parametrize("damage, expected", [
    (_nan_first_weight, "NaN or infinite weights"),
    (_drop_tensor, "missing"),
    (lambda d: (d / "weights.pt").write_bytes((d / "weights.pt").read_bytes()[:500]), "cannot read the weights"),
    (lambda d: (d / "weights.pt").unlink(), "cannot read the weights"),
    (_edit_config(lambda doc: doc["network"].update(hidden=32)), "has shape"),
    (_edit_config(lambda doc: doc["network"].update(hidden=True)), "'hidden' must be a positive integer"),
    (_edit_config(_short_normaliser), "'normaliser.names' lists 20 features"),
    (_edit_config(lambda doc: doc["normaliser"]["mean"].__setitem__(0, float("nan"))), "must be finite"),
    (_edit_config(lambda doc: doc["meta"].pop("batch_size")), "missing field 'batch_size'"),
    (_edit_config(lambda doc: doc["meta"].update(batch_size="512")), "'meta.batch_size' must be a positive"),
    (_edit_config(lambda doc: doc["meta"].update(compute_log_offset=[1.0])), "list of 2 numbers"),
    (lambda d: (d / "cost_model.json").write_text('{"format": "shardwise.costmodel/v2",'), "not a JSON"),
    (lambda d: (d / "cost_model.json").write_bytes(b"\xff\xfe{}"), "not a JSON"),
], ids=["nan-weight", "missing-tensor", "truncated-weights", "no-weights", "shape-mismatch", "bool-int",
        "short-normaliser", "nan-normaliser", "missing-field", "string-int", "bad-offset", "broken-json",
        "not-utf8"])
def test_a_damaged_model_is_refused_on_load_naming_the_file_and_field(trained, tmp_path, damage, expected):
    model, _ = trained
    directory = model.save(tmp_path / "m")
    damage(directory)
    with pytest.raises(ModelFileError, match=expected) as err:
        NeuralCostModel.load(directory)
    assert str(directory) in str(err.value) and "\n" not in str(err.value)


def test_predict_comm_any_number_of_devices_and_grows_with_width(trained):
    model, _ = trained
    for d in (2, 3, 8):
        out = model.predict_comm(np.full((2, d), 64), np.zeros((2, d)))
        assert out.shape == (2, d, 2) and np.all(out > 0)
    small, big = model.predict_comm(np.array([[16, 16], [500, 500]]), np.zeros((2, 2)))
    assert big.sum() > small.sum()


@pytest.mark.parametrize("num_devices", [1, 2, 16])
def test_a_candidates_all_to_all_is_its_row_of_the_changed_layout(trained, num_devices):
    """predict_comm_after (search prices each candidate device for a shard) is predict_comm's row for that
    device in the layout the shard would make, exactly, including when the candidate is the slowest device."""
    from shardwise.search.simulator import predict_comm_after_ms

    model, _ = trained
    rng = np.random.default_rng(num_devices)
    n, k = 30, min(3, num_devices)
    widths = rng.integers(0, 512, (n, num_devices)).astype(float)
    compute = rng.random((n, num_devices)) * 5
    devices = np.stack([rng.choice(num_devices, k, replace=False) for _ in range(n)])
    devices[0, 0] = compute[0].argmax()  # the slowest device takes more work
    added, new = rng.integers(4, 128, n).astype(float), rng.random((n, k)) * 6
    expected = np.zeros((n, k, 2))
    for i in range(n):
        for j, d in enumerate(devices[i]):
            w, c = widths[i].copy(), compute[i].copy()
            w[d] += added[i]
            c[d] = new[i, j]
            expected[i, j] = model.predict_comm(w[None], c[None])[0, d]
    np.testing.assert_allclose(model.predict_comm_after(widths, compute, devices, added, new), expected, rtol=1e-5)
    # a model without the fast path (a test double) is asked the same through the whole layouts
    slow = type("Slow", (), {"predict_comm": model.predict_comm})()
    np.testing.assert_allclose(predict_comm_after_ms(slow, widths, compute, devices, added, new), expected, rtol=1e-5)


def test_model_without_comm_data_says_so():
    df = cost_frame({"a": synthetic_tables("a", 12, 2), "h": synthetic_tables("h", 4, 3)}, {"a": 60, "h": 20}, 1)
    model, _ = train_cost_model(df, 0, TrainConfig(epochs=3, progress=False))
    assert not model.has_comm
    with pytest.raises(ValueError, match="no communication network"):
        model.predict_comm(np.ones((1, 2)), np.zeros((1, 2)))


def test_predictions_far_outside_the_training_range_stay_finite(trained):
    """Shards far outside the training range extrapolate the log target wildly (a tiny model predicted inf ms for
    10^8-row tables): capped, never inf, since search and policy training sum and divide costs."""
    model, report = trained
    summed = model.table_embeddings(list(report.test.shards[0])).sum(axis=0)
    extreme = np.stack([summed * scale for scale in (1.0, 1e3, 1e6)]).astype(np.float32)
    costs = model.compute_from_embeddings(extreme)
    assert np.all(np.isfinite(costs)) and np.all(costs > 0)
    assert np.all(np.isfinite(model.predict_comm(np.array([[10**9, 0]]), np.array([[1e9, 0.0]]))))


def test_a_measured_all_reduce_and_reduce_scatter_are_saved_and_loaded_with_the_model(trained, tmp_path):
    from shardwise.costmodel.data_parallel import AllReduceCost

    model, _ = trained
    none = NeuralCostModel.load(model.save(tmp_path / "none"))
    assert none.all_reduce is None and none.reduce_scatter is None
    model.all_reduce = AllReduceCost(0.1, 0.02, 2.0, backend="gloo", points=((2, 4096, 0.12),))
    model.reduce_scatter = AllReduceCost(0.05, 0.0, 1.0, collective="reduce_scatter")
    model.all_to_all = AllReduceCost(0.07, 0.0, 1.0, collective="all_to_all")
    try:
        loaded = NeuralCostModel.load(model.save(tmp_path / "with"))
    finally:
        model.all_reduce = model.reduce_scatter = model.all_to_all = None
    assert loaded.all_reduce == AllReduceCost(0.1, 0.02, 2.0, backend="gloo", points=((2, 4096, 0.12),))
    assert loaded.reduce_scatter == AllReduceCost(0.05, 0.0, 1.0, collective="reduce_scatter")
    assert loaded.all_to_all == AllReduceCost(0.07, 0.0, 1.0, collective="all_to_all") and loaded.all_gather is None
