"""The all-to-all at a fixed 0.05 + 0.05 ms per device, for tests of what the evaluator, the benchmark and
refinement do with measurements, not of the all-to-all: a gloo group's ranks took about 6 s to start and stop per
session on this 2-core machine (8 ranks longer). The tests of the exchange itself keep the real group
(test_profiling_comm.py, test_evaluation_refine.py's measured all-to-all, test_evaluation_suite.py's report)."""

from __future__ import annotations

from collections.abc import Sequence

from shardwise.profiling import CommTiming

FWD_MS = BWD_MS = 0.05
COLLECTIVE_MS = 0.1  #: every other collective (all-reduce, reduce-scatter, all-gather), any size


def fixed_all_to_all(layouts: Sequence[Sequence[int]], batch_size: int, **_: object) -> list[list[CommTiming]]:
    """Stands in for `measure_all_to_all_many`: every device of every layout at FWD_MS / BWD_MS."""
    return [[CommTiming(fwd_ms=FWD_MS, bwd_ms=BWD_MS, received_bytes=0, correct=None) for _ in layout]
            for layout in layouts]


class FixedAllToAllSession:
    """Stands in for `AllToAllSession` (a process group kept open): the same fixed figures, no ranks."""

    def __init__(self, num_devices: int, backend: str | None = None) -> None:
        self.num_devices, self.backend = num_devices, backend or "gloo"

    def __enter__(self) -> FixedAllToAllSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def measure(self, layouts: Sequence[Sequence[int]], batch_size: int, iters: int = 10,
                **_: object) -> list[list[CommTiming]]:
        return fixed_all_to_all(layouts, batch_size)

    def measure_collective(self, op: str, sizes_bytes: Sequence[int], *, iters: int = 10,
                           **_: object) -> list[tuple[float, ...]]:
        return [(COLLECTIVE_MS,) * iters for _ in sizes_bytes]

    def measure_all_reduce(self, sizes_bytes: Sequence[int], *, iters: int = 10,
                           **_: object) -> list[tuple[float, ...]]:
        return self.measure_collective("all_reduce", sizes_bytes, iters=iters)
