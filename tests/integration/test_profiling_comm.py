"""The all-to-all benchmark across real gloo processes, one call at a time or in a session that keeps its group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardwise.profiling.comm import COLLECTIVES, AllToAllSession, local_batch_sizes, measure_all_to_all

pytestmark = pytest.mark.integration


def test_a_session_times_the_collectives_of_row_wise_and_data_parallel_tables() -> None:
    """All-reduces, reduce-scatters, all-gathers and even all-to-alls of fp32, each size `iters` times (the time of a
    size is a benchmark's to judge: data_parallel_accuracy); an unknown collective is refused before any rank
    is asked."""
    with AllToAllSession(3, backend="gloo") as session:
        timed = {op: session.measure_collective(op, [4096, 2**16], warmup_iters=1, iters=5) for op in COLLECTIVES}
        with pytest.raises(ValueError, match="collective 'gather' is not one of"):
            session.measure_collective("gather", [4096])
        assert session.measure_all_reduce([4096], iters=2)[0]  # the same group still answers
    for op, (small, large) in timed.items():
        assert len(small) == len(large) == 5 and min(small + large) >= 0, op


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_session_keeps_one_group_for_several_measurements_and_reaps_its_ranks() -> None:
    """Refinement measures a few layouts each round: one process group serves them all, checked exchanges stay
    correct from one call to the next, and leaving the session leaves no rank behind."""
    with AllToAllSession(3, backend="gloo") as session:
        ranks = list(session._ranks)
        first = session.measure([[16, 8, 0]], 12, warmup_iters=1, iters=2, check=True)
        second = session.measure([[4, 4, 4], [0, 8, 24]], 12, warmup_iters=1, iters=2, check=True)
        assert session._ranks == ranks  # the same processes answered both
    assert [len(layout) for layout in first + second] == [3, 3, 3]
    assert all(t.correct is True for layout in first + second for t in layout)
    assert all(not p.is_alive() and p.exitcode == 0 for p in ranks)


@pytest.mark.slow
def test_a_rank_that_fails_stops_the_session_with_one_line() -> None:
    """A rank that dies mid-session (here: killed) is reported, and the other ranks are not left waiting."""
    session = AllToAllSession(2, backend="gloo")
    with pytest.raises(RuntimeError, match=r"all-to-all rank 1 exited with code -9"), session:
        session.measure([[8, 8]], 4, warmup_iters=0, iters=1)
        ranks = list(session._ranks)
        os.kill(ranks[1].pid, signal.SIGKILL)
        ranks[1].join(timeout=30)
        session.measure([[8, 8]], 4, warmup_iters=0, iters=1)
    assert all(not p.is_alive() for p in ranks)
    with pytest.raises(ValueError, match="every layout needs 2 devices"), AllToAllSession(2, backend="gloo") as other:
        other.measure([[8, 8, 8]], 4)


@pytest.mark.slow
def test_ranks_leave_when_their_parent_is_killed(tmp_path) -> None:
    """A SIGKILLed parent sends no stop: its ranks notice they were orphaned and exit, not wait forever."""
    script = (
        "import os, signal\n"
        "from shardwise.profiling.comm import AllToAllSession\n"
        "if __name__ == '__main__':\n"
        "    with AllToAllSession(2, backend='gloo') as session:\n"
        "        session.measure([[8, 8]], 4, warmup_iters=0, iters=1)\n"
        "        print(' '.join(str(p.pid) for p in session._ranks), flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    (tmp_path / "parent.py").write_text(script)
    proc = subprocess.run([sys.executable, str(tmp_path / "parent.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 60
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_running(pid) for pid in pids), "orphaned ranks still running"


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie left for an init that does not reap counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
