"""The all-to-all benchmark across 2 real gloo processes."""

from __future__ import annotations

import pytest

from shardwise.profiling.comm import local_batch_sizes, measure_all_to_all

pytestmark = pytest.mark.integration


def test_two_process_gloo_all_to_all_moves_each_device_its_slice() -> None:
    widths, batch = [24, 8], 101
    timings = measure_all_to_all(widths, batch, backend="gloo", warmup_iters=1, iters=3, check=True)
    assert len(timings) == 2
    for rank, timing in enumerate(timings):
        assert timing.fwd_ms > 0 and timing.bwd_ms > 0
        assert timing.correct is True
        # each device receives its share of the batch for every device's columns (fp32)
        assert timing.received_bytes == local_batch_sizes(batch, 2)[rank] * sum(widths) * 4


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 devices"):
        measure_all_to_all([8], 16)
    with pytest.raises(ValueError, match="widths must be >= 0"):
        measure_all_to_all([8, -4], 16)
