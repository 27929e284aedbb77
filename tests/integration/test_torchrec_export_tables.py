"""A TorchRec model's tables as shardwise's workload (`export_tables`): an EmbeddingBagCollection on the meta device
and TorchRec's DLRM_DCN give their tables with the pooling factors their `ParameterConstraints` state; the file they
are saved as is a workload `shardwise workload from` takes; what cannot be a table is refused in one line."""

from __future__ import annotations

import pytest
import torch
from torchrec.distributed.planner import ParameterConstraints
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from shardwise.integrations.torchrec import export_tables
from shardwise.jobs import workload as job
from shardwise.workload import TableSetError, load_tables, save_tables

pytestmark = pytest.mark.integration

META = torch.device("meta")


def _ebc(names=("user", "item", "ad"), *, dims=(16, 32, 64)) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(device=META, tables=[
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=1000 * (i + 1), feature_names=[f"f_{n}"])
        for i, (n, d) in enumerate(zip(names, dims))])


def test_an_ebc_on_meta_gives_its_tables_and_constraints_pooling_factors():
    constraints = {"user": ParameterConstraints(pooling_factors=[3.0, 2.5]),  # a table two features look up
                   "item": ParameterConstraints(sharding_types=["table_wise"])}
    tables = export_tables(_ebc(), constraints, batch_size=4096, zipf_alpha=1.05)
    assert tables.batch_size == 4096
    assert [(t.name, t.rows, t.dim, t.pooling_factor, t.zipf_alpha) for t in tables.tables] == [
        ("user", 1000, 16, 5.5, 1.05), ("item", 2000, 32, 1.0, 1.05), ("ad", 3000, 64, 1.0, 1.05)]
    # no skew given: none stated (profiling samples uniformly), not a guess
    assert all(t.zipf_alpha is None and t.reuse_bins is None for t in export_tables(_ebc(), batch_size=8).tables)


def test_dlrm_dcn_and_a_sequence_collection_saved_as_a_workload(tmp_path):
    from torchrec.models.dlrm import DLRM_DCN

    model = torch.nn.Module()
    model.dlrm = DLRM_DCN(_ebc(("cat_0", "cat_1", "cat_2", "cat_3"), dims=(16,) * 4), dense_in_features=13,
                          dense_arch_layer_sizes=[32, 16], over_arch_layer_sizes=[32, 1], dcn_num_layers=2,
                          dcn_low_rank_dim=8, dense_device=torch.device("cpu"))
    # a second collection reusing a name: both named by their collection's path, as the drop-in planner names them
    model.history = EmbeddingCollection(device=META, tables=[
        EmbeddingConfig(name="cat_0", embedding_dim=16, num_embeddings=500, feature_names=["seq"])])
    constraints = {f"cat_{i}": ParameterConstraints(pooling_factors=[float(i + 1)]) for i in range(4)}
    tables = export_tables(model, constraints, batch_size=2048)
    assert [t.name for t in tables.tables] == ["dlrm.sparse_arch.embedding_bag_collection.cat_0", "cat_1", "cat_2",
                                               "cat_3", "history.cat_0"]
    assert [t.pooling_factor for t in tables.tables] == [1.0, 2.0, 3.0, 4.0, 1.0]

    path = save_tables(tables, tmp_path / "dcn.json")
    result = job.build(job.WorkloadSettings(tables=str(path), holdout_fraction=0.2, out=str(tmp_path / "w")))
    assert result.population.num_tables == 5 and load_tables(result.split.holdout_path).tables


@pytest.mark.parametrize("module, constraints, expected", [
    (torch.nn.Linear(2, 2), None, "Linear: holds no EmbeddingBagCollection or EmbeddingCollection"),
    (_ebc(), {"usr": ParameterConstraints(pooling_factors=[2.0])}, r"constraints name table\(s\) \['usr'\]"),
    (_ebc(dims=(16, 30, 64)), None, "table 'item': field 'dim': dim 30 is not a multiple of 4"),
])
def test_what_cannot_be_a_workload_is_refused_naming_it(module, constraints, expected):
    with pytest.raises(TableSetError, match=expected):
        export_tables(module, constraints, batch_size=64)
