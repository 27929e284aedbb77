"""A TorchRec `Partitioner` for proposals whose shards already have their ranks (shardwise's search places them):
checks each rank's storage and places the shards left without a rank with TorchRec's own partitioner, in what the
placed ones leave."""

from __future__ import annotations

import copy

from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.types import (
    Partitioner,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Storage,
    Topology,
)


class PlacedPartitioner(Partitioner):
    """Keeps the ranks a proposal gives; `then` places the options that have none (all of them, where a proposal
    gives no rank at all, as TorchRec's own proposers' do)."""

    def __init__(self, then: Partitioner | None = None) -> None:
        self.then = then or GreedyPerfPartitioner()

    def partition(self, proposal: list[ShardingOption], storage_constraint: Topology) -> list[ShardingOption]:
        placed = [o for o in proposal if o.shards and all(s.rank is not None for s in o.shards)]
        if not placed:
            return self.then.partition(proposal, storage_constraint)
        left = copy.deepcopy(storage_constraint)
        for option in placed:
            for shard in option.shards:
                assert shard.rank is not None and shard.storage is not None  # placed, and estimated by the enumerator
                device = left.devices[shard.rank]
                device.storage = device.storage - shard.storage
                if device.storage.hbm < 0 or device.storage.ddr < 0:
                    need = _gib(shard.storage)
                    raise PlannerError(
                        f"rank {shard.rank}: {option.fqn} ({option.sharding_type}, {need}) does not fit: "
                        f"{_gib(device.storage + shard.storage)} left there", PlannerErrorType.PARTITION)
        rest = [o for o in proposal if not any(o is p for p in placed)]
        ranked = iter(self.then.partition(rest, left) if rest else [])
        # in the proposal's order, as TorchRec's partitioners return it
        return [copy.deepcopy(o) if any(o is p for p in placed) else next(ranked) for o in proposal]


def _gib(storage: Storage) -> str:
    return f"HBM {storage.hbm / 2**30:.3f} GiB, DDR {storage.ddr / 2**30:.3f} GiB"
