"""A random KeyedJaggedTensor over tables: the sparse input the DMP tests feed sharded and unsharded models alike."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shardwise.workload import TableSpec


def random_kjt(tables: Sequence[TableSpec], batch_size: int, seed: int):  # noqa: ANN201 - a KeyedJaggedTensor
    """0 to 3 ids a sample for each table, uniform over its rows, from a generator seeded with `seed`."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    lengths, values = [], []
    for t in tables:
        n = torch.randint(0, 4, (batch_size,), generator=g)
        lengths.append(n)
        values.append(torch.randint(0, t.rows, (int(n.sum()),), generator=g))
    return KeyedJaggedTensor.from_lengths_sync(keys=[t.name for t in tables], values=torch.cat(values),
                                               lengths=torch.cat(lengths))
