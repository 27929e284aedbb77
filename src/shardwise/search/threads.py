"""How search runs torch: on one CPU thread while it plans or trains a policy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one CPU thread, with subnormal floats flushed to zero. Search makes many small batched calls
    (cost-model heads, policy steps): fanning each out to a thread pool only adds synchronisation, and on a busy
    machine the pool's spin-waits cost ten times more than they save (NeuroShard, 100 tables on 8 devices: 31 s
    vs 1.8 s). Subnormal results cost a microcode assist each on many CPUs and are worth nothing to a cost
    estimate (see `shardwise.costmodel.networks.zero_subnormal_weights`)."""
    import torch  # here, not at the top: the search package's modules import without torch (`plan --help`)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    flushing = torch.set_flush_denormal(True)  # False where the CPU cannot (then nothing changed)
    try:
        yield
    finally:
        if flushing:
            torch.set_flush_denormal(False)  # torch's default; it has no getter to restore another
        torch.set_num_threads(before)
