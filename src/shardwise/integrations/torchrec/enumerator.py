"""TorchRec's `EmbeddingEnumerator`, plus the column-wise options shardwise's search lays out.

NeuroShard splits a table into 1, 2, 4, ... equal column slices (each a multiple of 4 columns, at least the table's
`min_partition`, at most one per rank) on the fused kernel. TorchRec's enumerator yields one column-wise option per
table and kernel, of its own block width; for every such option on the fused kernel this one adds the same option
split into those slice counts, estimated by TorchRec's estimators. Each added option derives from one TorchRec offered, so sharders and constraints bound them;
each has its own `storage_hash`, so a plan with them goes through TorchRec's `PlanLoader`. The planner context hash
covers TorchRec's own search space (`last_stored_search_space`), which the added options follow from."""

from __future__ import annotations

import copy

from torch import nn
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import PlannerErrorType, Shard, ShardingOption
from torchrec.distributed.types import ModuleSharder

from shardwise.workload.tables import DIM_ALIGNMENT

from .errors import PlannerError
from .space import FUSED


class ShardwiseEnumerator(EmbeddingEnumerator):
    """TorchRec's options, and each column-wise one also split in the equal slices shardwise's search uses."""

    #: the options the last `enumerate` added to TorchRec's (`torchrec_options` leaves them out)
    splits: tuple[ShardingOption, ...] = ()

    def enumerate(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> list[ShardingOption]:
        try:
            options = super().enumerate(module, sharders)
        except RuntimeError as err:  # TorchRec's enumerator: constraints that leave a table no option
            raise PlannerError(str(err).splitlines()[0], PlannerErrorType.STRICT_CONSTRAINTS) from None
        added: list[ShardingOption] = []
        offered = {(o.fqn, o.compute_kernel, o.num_shards) for o in options if o.sharding_type == "column_wise"}
        for option in options:
            if (option.sharding_type, option.compute_kernel) != ("column_wise", FUSED):
                continue  # the search splits tables on the kernel it has measured
            rows, dim = int(option.tensor.shape[0]), int(option.tensor.shape[1])
            constraint = (self._constraints or {}).get(option.name)
            narrowest = max(DIM_ALIGNMENT, getattr(constraint, "min_partition", None) or DIM_ALIGNMENT)
            pieces = 1
            while pieces <= self._world_size and dim % pieces == 0 and (dim // pieces) % DIM_ALIGNMENT == 0 and (
                    pieces == 1 or dim // pieces >= narrowest):
                if (option.fqn, option.compute_kernel, pieces) not in offered:
                    offered.add((option.fqn, option.compute_kernel, pieces))
                    split = copy.deepcopy(option)
                    split.shards = [Shard(size=[rows, dim // pieces], offset=[0, 0])]  # one slice, estimated below
                    added.append(split)
                pieces *= 2
        self._estimate_slices(added)
        self.splits = tuple(added)
        return options + added

    def torchrec_options(self, search_space: list[ShardingOption]) -> list[ShardingOption]:
        """`search_space` without the splits the last `enumerate` added: the options TorchRec's own enumerator
        offers, in its order (what TorchRec's proposers plan from in TorchRec's planner)."""
        added = {id(o) for o in self.splits}
        return [o for o in search_space if id(o) not in added]

    def _estimate_slices(self, splits: list[ShardingOption]) -> None:
        """Each split's one slice estimated by TorchRec's estimators, then laid out over the table's columns: equal
        slices of a column-wise option get equal estimates (`test_split_estimates_are_torchrecs`), and
        estimating one per split instead of each keeps planning near TorchRec's planner's time."""
        if not splits:
            return
        self.populate_estimates(splits)
        for split in splits:
            (slice_,) = split.shards
            rows, width = slice_.size
            split.shards = [Shard(size=[rows, width], offset=[0, k * width], storage=copy.copy(slice_.storage),
                                  perf=copy.copy(slice_.perf)) for k in range(int(split.tensor.shape[1]) // width)]
