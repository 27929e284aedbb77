"""How search runs torch: on one CPU thread while it plans or trains a policy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one CPU thread. Search makes many small batched calls (cost-model heads, policy steps):
    fanning each out to a thread pool only adds synchronisation, and on a busy machine the pool's spin-waits
    cost ten times more than they save (NeuroShard, 100 tables on 8 devices: 31 s vs 1.8 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
