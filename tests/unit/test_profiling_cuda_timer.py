"""The CUDA timer's logic, run on a CPU against a simulated device: events that fire when the device reaches them,
and a device-side wait that keeps the device busy without holding the host. The GPU itself is checked in tests/gpu
(benchmarks/gpu_check.sh); this checks the branches that must not fail there first: the hold covering the host's
launches, growing when they outlast it, giving up when the host waits on the device, and the fallbacks."""

from __future__ import annotations

import contextlib
import logging
import time

import pytest
import torch

from shardwise.profiling import TimingProtocol
from shardwise.profiling import kernel as kernel_module
from shardwise.profiling import timers as timers_module
from shardwise.profiling.kernel import ShardKernel, Timer

CUDA = torch.device("cuda")


class _Device:
    """A device that runs its queue in order: a wait keeps it busy until `free_at` (host seconds)."""

    free_at = 0.0

    @classmethod
    def reach(cls) -> float:
        """When the device gets to something queued now: at once if idle, else after what is queued."""
        return max(time.perf_counter(), cls.free_at)


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = _Device.reach()

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1e3

    def synchronize(self) -> None:
        _synchronize()


def _synchronize(device: object = None) -> None:
    while time.perf_counter() < _Device.free_at:
        pass


def _sleep(cycles: int) -> None:  # 1e6 cycles a millisecond, queued: the host goes on at once
    _Device.free_at = _Device.reach() + cycles / 1e9


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", _synchronize)
    monkeypatch.setattr(torch.cuda, "_sleep", _sleep)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    timers_module.sleep_cycles_per_ms.cache_clear()
    _Device.free_at = 0.0
    yield
    timers_module.sleep_cycles_per_ms.cache_clear()


class _Kernel:
    """A kernel whose launch takes `launch_ms` on the host and whose forward then keeps the device busy for
    `device_ms` (with `syncs`, the host first waits for the device)."""

    def __init__(self, launch_ms: float = 0.0, syncs: bool = False, device_ms: float = 0.0) -> None:
        self.launch_ms, self.syncs, self.device_ms = launch_ms, syncs, device_ms
        self.grad_output = torch.ones(4)

    def forward(self) -> torch.Tensor:
        if self.syncs:
            _synchronize()
        end = time.perf_counter() + self.launch_ms / 1e3
        while time.perf_counter() < end:
            pass
        _Device.free_at = _Device.reach() + self.device_ms / 1e3
        return torch.ones(4, requires_grad=True) * 2


def _timer(cuda_timer: str) -> Timer:
    # decided by hand: for_device would ask torch for the (absent) GPU's L2
    return Timer(CUDA, TimingProtocol(cuda_timer=cuda_timer, flush_cache=False, clock="wall"))


def test_the_sleeps_speed_is_calibrated_on_the_device(device) -> None:
    assert timers_module.sleep_cycles_per_ms(CUDA) == pytest.approx(1e6, rel=0.05)


def test_a_hold_longer_than_the_launches_times_the_device_alone(device) -> None:
    timer = _timer("held")
    timed = timer.call(_Kernel(launch_ms=0.2))  # type: ignore[arg-type]
    # the simulated kernels take no device time: the events see none of the host's 0.2 ms launch
    assert timed.timer == "held" and timed.fwd_ms == pytest.approx(0.0, abs=0.05)
    assert timed.launch_ms is not None and timed.launch_ms >= 0.2
    assert timer.uncovered == 0 and timer.held_calls == 1


def test_a_hold_the_launches_outlast_is_lengthened_and_the_call_timed_again(device) -> None:
    timer = _timer("held")
    slow = _Kernel(launch_ms=3.0)  # longer than the first hold (1 ms)
    timed = timer.call(slow)  # type: ignore[arg-type]
    assert timer.uncovered == 0 and timer.hold_ms >= 6.0
    assert timed.fwd_ms == pytest.approx(0.0, abs=0.2)  # covered on the retry: the launch is not in it
    # the events timer, where the launches outlast the device's work, times the launch
    assert _timer("events").call(slow).fwd_ms >= 3.0  # type: ignore[arg-type]


def test_a_host_that_waits_on_the_device_stops_the_holds(device, caplog: pytest.LogCaptureFixture) -> None:
    timer = _timer("held")
    syncing = _Kernel(launch_ms=0.1, syncs=True)
    with caplog.at_level(logging.WARNING, logger="shardwise.profiling.kernel"):
        timer.call(syncing)  # type: ignore[arg-type]
    assert timer.uncovered == 1 and timer.hold_futile and "holding the stream no longer" in caplog.text
    started = time.perf_counter()
    timer.call(syncing)  # type: ignore[arg-type]
    assert time.perf_counter() - started < 0.05  # no retries, no long holds any more
    assert timer.hold_ms == timers_module.MIN_HOLD_MS


def test_a_kernel_that_cannot_be_captured_is_timed_held_saying_why(device, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shardwise.profiling.kernel"):
        timed = _timer("graph").call(_Kernel())  # type: ignore[arg-type]
    assert timed.timer == "held" and "capture failed" in caplog.text


def test_without_the_device_side_wait_the_timer_uses_events(device, monkeypatch, caplog) -> None:
    def broken(cycles: int) -> None:
        raise RuntimeError("")

    monkeypatch.setattr(torch.cuda, "_sleep", broken)
    timer = _timer("held")
    with caplog.at_level(logging.WARNING, logger="shardwise.profiling.kernel"):
        assert timer.call(_Kernel()).timer == "events"  # type: ignore[arg-type]
    assert timer.cuda_timer == "events" and "RuntimeError: no message" in caplog.text
    monkeypatch.delattr(torch.cuda, "_sleep")
    assert _timer("held").cuda_timer == "events"


@pytest.mark.parametrize(("launch_ms", "device_ms"), [(0.3, 2.0), (2.0, 0.3)], ids=["device-bound", "launch-bound"])
def test_a_queue_behind_one_hold_times_each_calls_device_work(device, launch_ms, device_ms) -> None:
    timer = _timer("queued")
    calls = timer.calls(_Kernel(launch_ms=launch_ms, device_ms=device_ms), 6)  # type: ignore[arg-type]
    # the first call alone, held (it allocates; it tells the launch and the work), the rest queued behind one hold
    assert [c.timer for c in calls] == ["held"] + ["queued"] * 5
    assert timer.cuda_timer == "queued" and timer.uncovered == 0
    for c in calls:  # the device's forward, not the host's launch, whichever is longer
        assert abs(c.fwd_ms - device_ms) < abs(launch_ms - device_ms) / 2
        assert c.launch_ms is not None and c.launch_ms >= launch_ms


def test_a_queue_whose_launches_outlast_its_hold_is_timed_again_behind_a_longer_one(device, monkeypatch) -> None:
    kernel = _Kernel(launch_ms=1.0, device_ms=0.1)
    holds: list[float] = []
    hold = Timer._hold

    def counted(self: Timer, ms: float) -> bool:
        holds.append(ms)
        return hold(self, ms)

    monkeypatch.setattr(Timer, "_hold", counted)
    timer = _timer("queued")
    first = timer._held(kernel, None)  # type: ignore[arg-type]
    # a first call that launched fast misjudges the lead the queue needs
    quick = first._replace(launch_ms=0.05, fwd_ms=0.1, bwd_ms=0.0)
    holds.clear()
    calls = timer._queued(kernel, 5, quick)  # type: ignore[arg-type]
    assert len(holds) >= 2 and holds[-1] > holds[0]
    assert {c.timer for c in calls} == {"queued"}
    assert all(c.fwd_ms < 0.55 for c in calls)  # the device's 0.1 ms, not the host's 1 ms launch


def test_a_queue_the_host_waits_on_is_timed_call_by_call(device, caplog: pytest.LogCaptureFixture) -> None:
    timer = _timer("queued")
    with caplog.at_level(logging.WARNING, logger="shardwise.profiling.kernel"):
        calls = timer.calls(_Kernel(launch_ms=0.1, syncs=True, device_ms=0.5), 4)  # type: ignore[arg-type]
    assert {c.timer for c in calls} == {"held"} and timer.cuda_timer == "held"
    assert "timing them call by call" in caplog.text


def test_time_kernel_queues_a_shards_calls_and_keeps_the_timed_ones(device, monkeypatch) -> None:
    from shardwise.profiling.kernel import time_kernel

    protocol = TimingProtocol(cuda_timer="queued", flush_cache=False, clock="wall", warmup_iters=2, iters=5,
                              reference_normalised=False)
    monkeypatch.setattr(TimingProtocol, "for_device", lambda self, device: self)
    timing = time_kernel(_Kernel(launch_ms=0.2, device_ms=1.0), CUDA, protocol)  # type: ignore[arg-type]
    assert timing.timer == "queued" and 0.6 < timing.fwd_ms < 1.4
    assert timing.reference_ms is None and timing.launch_ms is not None and timing.launch_ms >= 0.2


# milliseconds, not tenths: a queue a scheduler's time slice outlasts (a busy machine, the tests' other worker) would
# leave the simulated device idle before `meanwhile` runs
@pytest.mark.parametrize("host_ms", [5.0, 30.0], ids=["shorter than the queue", "longer than the queue"])
def test_work_meanwhile_runs_once_while_the_device_runs_the_queue_and_leaves_its_timings(device, host_ms) -> None:
    """The profiler builds the next shard's kernel while the device runs this one's queued calls: it runs once,
    before the host waits for the device, and the calls' device times stay the device's work."""
    pending: list[float] = []

    def meanwhile() -> None:  # host work: busy for host_ms, then (as a kernel's weights' init) device work queued
        pending.append(_Device.free_at - time.perf_counter())
        end = time.perf_counter() + host_ms / 1e3
        while time.perf_counter() < end:
            pass
        _Device.free_at = _Device.reach() + 1e-2

    calls = _timer("queued").calls(_Kernel(launch_ms=1.0, device_ms=5.0), 6, meanwhile)  # type: ignore[arg-type]
    assert len(pending) == 1 and pending[0] > 0  # once, with the device still busy with the queue
    assert [c.timer for c in calls] == ["held"] + ["queued"] * 5
    assert all(abs(c.fwd_ms - 5.0) < 2.0 for c in calls)
    # where the calls are not queued (a CPU, another timer) it runs after them
    ran: list[int] = []
    held = _timer("held").calls(_Kernel(launch_ms=0.1, device_ms=0.5), 3, lambda: ran.append(1))  # type: ignore[arg-type]
    assert ran == [1] and len(held) == 3


def test_the_shard_kernel_gives_its_batch_back_per_table() -> None:
    kernel = ShardKernel(tbe=torch.nn.Identity(), indices=torch.tensor([1, 2, 3, 0]),
                         offsets=torch.tensor([0, 1, 3, 3, 4]), grad_output=torch.ones(2), num_tables=2)
    (a_len, a_ids), (b_len, b_ids) = kernel.per_table
    assert a_len.tolist() == [1, 2] and a_ids.tolist() == [1, 2, 3]
    assert b_len.tolist() == [0, 1] and b_ids.tolist() == [0]


def test_a_next_kernel_that_fails_to_build_fails_at_its_turn_after_this_shards_timing(monkeypatch) -> None:
    """On CUDA the next shard's kernel is built while this one's calls run: where that build fails, this shard's
    timing still comes back (the profiler stores it), and the error comes when the failed shard's turn does."""
    from shardwise.profiling import kernel
    from shardwise.workload import TableSpec

    built: list[str] = []

    def build(tables, batch_size, **kwargs):  # type: ignore[no-untyped-def]
        if tables[0].name == "bad":
            raise ValueError("tables: no such kernel")
        built.append(tables[0].name)
        return tables[0].name

    def timed(timer, k, protocol, meanwhile=None):  # type: ignore[no-untyped-def]
        if meanwhile is not None:
            meanwhile()  # as the queued timer does, while the device runs the calls
        return k

    monkeypatch.setattr(kernel, "resolve_device", lambda device: CUDA)
    monkeypatch.setattr(TimingProtocol, "for_device", lambda self, device: self.model_copy(
        update={"reference_normalised": False, "warmup_iters": 1}))
    monkeypatch.setattr(kernel, "build_shard_kernel", build)
    monkeypatch.setattr(kernel, "time_with", timed)
    shards = [[TableSpec(name=n, rows=10, dim=4, pooling_factor=1.0)] for n in ("a", "bad", "c")]
    timings = kernel.measure_shards(shards, 8, device="cuda")
    assert next(timings) == "a" and built == ["a"]  # the next one's build was tried while "a" ran, and failed
    with pytest.raises(ValueError, match="no such kernel"):
        next(timings)


def test_each_shard_starts_from_the_hold_the_last_one_learned(device, monkeypatch) -> None:
    """A host that launches a call in 1.5 ms outlasts a fresh timer's first 1 ms hold: the profiler's first shard
    times its first call again behind a longer hold, and the shards after it start from that hold, not anew."""
    started: list[float] = []
    timers: list[Timer] = []

    class Recorded(Timer):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            started.append(self.hold_ms)
            timers.append(self)

    monkeypatch.setattr(kernel_module, "Timer", Recorded)
    monkeypatch.setattr(kernel_module, "resolve_device", lambda device: CUDA)
    monkeypatch.setattr(kernel_module, "build_shard_kernel",
                        lambda tables, batch_size, **kwargs: _Kernel(launch_ms=1.5, device_ms=0.5))
    protocol = TimingProtocol(cuda_timer="queued", flush_cache=False, clock="wall", warmup_iters=1, iters=3,
                              reference_normalised=False)
    monkeypatch.setattr(TimingProtocol, "for_device", lambda self, device: self)
    from shardwise.workload import TableSpec

    shards = [[TableSpec(name=f"t{i}", rows=10, dim=4, pooling_factor=1.0)] for i in range(3)]
    timings = list(kernel_module.measure_shards(shards, 8, device="cuda", protocol=protocol))
    assert [t.timer for t in timings] == ["queued"] * 3
    assert started[0] == timers_module.FIRST_HOLD_MS and timers[0].retried >= 1
    assert all(hold >= 2 * 1.5 for hold in started[1:])  # the margin over the host's launch the first one learned
