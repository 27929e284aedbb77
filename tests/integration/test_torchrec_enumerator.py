"""ShardwiseEnumerator: TorchRec's options plus the column splits shardwise's search lays out, estimated as
TorchRec's estimators estimate them."""

from __future__ import annotations

import copy

import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import Shard
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shardwise.integrations.torchrec import ShardwiseEnumerator

pytestmark = pytest.mark.integration

TOPOLOGIES = {"cuda": {"hbm_cap": 2**32}, "cpu": {"ddr_cap": 2**32}}


def _module() -> EmbeddingBagCollection:
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=1000 * (i + 1), feature_names=[f"f{i}"])
        for i, dim in enumerate((128, 64, 48))], device=torch.device("meta"))


def _enumerators(device: str) -> tuple[ShardwiseEnumerator, EmbeddingEnumerator]:
    topology = Topology(world_size=8, compute_device=device, **TOPOLOGIES[device])
    constraints = {"t1": ParameterConstraints(pooling_factors=[7.0]), "t2": ParameterConstraints(min_partition=24)}
    return (ShardwiseEnumerator(topology=topology, batch_size=512, constraints=constraints),
            EmbeddingEnumerator(topology=topology, batch_size=512, constraints=constraints))


@pytest.mark.parametrize("device", TOPOLOGIES)
def test_split_estimates_are_torchrecs(device):
    ours, theirs = _enumerators(device)
    options = ours.enumerate(_module(), [EmbeddingBagCollectionSharder()])
    torchrecs = theirs.enumerate(_module(), [EmbeddingBagCollectionSharder()])
    added = options[len(torchrecs):]
    assert added and all(o.sharding_type == "column_wise" and o.compute_kernel == "fused" for o in added)
    for split in added:
        full = copy.deepcopy(split)  # every slice estimated by TorchRec's estimators, as for its own options
        full.shards = [Shard(size=list(s.size), offset=list(s.offset)) for s in split.shards]
        ours.populate_estimates([full])
        assert [(s.storage, s.perf) for s in split.shards] == [(s.storage, s.perf) for s in full.shards], split.fqn


@pytest.mark.parametrize("device", TOPOLOGIES)
def test_splits_are_equal_power_of_two_slices_within_min_partition_and_the_ranks(device):
    ours, theirs = _enumerators(device)
    options = ours.enumerate(_module(), [EmbeddingBagCollectionSharder()])
    widths: dict[str, set[tuple[int, ...]]] = {}
    for option in options:
        if (option.sharding_type, option.compute_kernel) == ("column_wise", "fused"):
            widths.setdefault(option.name, set()).add(tuple(s.size[1] for s in option.shards))
            assert [s.offset[1] for s in option.shards] == [sum(s.size[1] for s in option.shards[:k])
                                                            for k in range(len(option.shards))]
    assert {(128,), (64, 64), (32,) * 4, (16,) * 8} <= widths["t0"]  # up to one slice a rank (8)
    assert (8,) * 8 in widths["t1"] and (4,) * 16 not in widths["t1"]
    assert (24, 24) in widths["t2"] and (12,) * 4 not in widths["t2"]  # min_partition 24
    # TorchRec's own options come first, unchanged: the planner context hash covers them
    assert theirs.enumerate(_module(), [EmbeddingBagCollectionSharder()])[0].fqn == options[0].fqn
