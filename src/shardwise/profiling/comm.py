"""The measured cost of the embedding all-to-all: torch.distributed across D processes (NCCL on GPU, gloo on CPU).

Table-wise sharding: device r holds the pooled output [B, width_r] of its tables for the whole batch; the
forward all-to-all sends each device j its B/D slice of every device's output (`all_to_all_single` with split
sizes), and backward sends the gradients of those slices back (the reverse exchange).

A data-parallel table leaves the all-to-all: every device holds a replica and its dense gradient (rows x dim
fp32) is all-reduced each step (`all_reduce` with sum, what DDP runs on the gradient buckets); `measure_all_reduce`
times that collective the same way. A row-wise table's pooled outputs are partial sums on every device: they are
reduce-scattered in forward and their gradients all-gathered in backward, and its ids are sent to the devices that
hold their rows (an even all-to-all); `AllToAllSession.measure_collective` times each of these.

Each timed exchange starts after a barrier, but the ranks leave a barrier at different moments (on a shared
CPU by whole scheduler slices), and a rank's own clock would then count the wait for the last peer to arrive
as its exchange time. All ranks run on one host and read one monotonic clock, so a device's time is measured
from the moment the last rank entered the exchange to the moment this rank finished it; the median over
iterations then removes the remaining preemptions.
"""

from __future__ import annotations

import os
import queue
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .processes import main_module_hidden

#: what a rank reports once it has joined the process group
READY = "ready"


@dataclass(frozen=True)
class CommTiming:
    """One device's median forward and backward all-to-all ms, and what it received in forward."""

    fwd_ms: float
    bwd_ms: float
    received_bytes: int
    correct: bool | None  # check mode: whether the received slices held the right values (else None)
    # every timed iteration's ms (the medians above are over these): callers pool them across rounds
    fwd_samples_ms: tuple[float, ...] = ()
    bwd_samples_ms: tuple[float, ...] = ()


def local_batch_sizes(batch_size: int, num_devices: int) -> list[int]:
    """Each device's slice of the batch after the forward all-to-all (the first B % D get one more)."""
    base, extra = divmod(batch_size, num_devices)
    return [base + (1 if r < extra else 0) for r in range(num_devices)]


def default_backend(device_type: str) -> str:
    """NCCL for CUDA, gloo for CPU."""
    return "nccl" if device_type == "cuda" else "gloo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pooled_output(rank: int, width: int, batch_size: int, device: torch.device) -> torch.Tensor:
    """Device `rank`'s pooled output [B, width] in check mode: each value encodes (rank, sample, column)."""
    rows = torch.arange(batch_size, dtype=torch.float64, device=device).unsqueeze(1)
    cols = torch.arange(width, dtype=torch.float64, device=device).unsqueeze(0)
    return (rank * 1e6 + rows * 1e2 + cols % 100).to(torch.float32)


def expected_received(
    widths: Sequence[int], batch_size: int, rank: int, device: torch.device | None = None
) -> torch.Tensor:
    """What device `rank` must hold after the forward all-to-all in check mode: [B_rank, sum(widths)]."""
    device = device or torch.device("cpu")
    sizes = local_batch_sizes(batch_size, len(widths))
    lo = sum(sizes[:rank])
    parts = [pooled_output(j, w, batch_size, device)[lo : lo + sizes[rank]] for j, w in enumerate(widths)]
    return torch.cat(parts, dim=1)


def _exchange(
    rank: int, widths: Sequence[int], batch_size: int, device: torch.device, check: bool
) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int], bool | None]:
    """One forward exchange: (send [B, w], recv, send splits, receive splits, check result or None)."""
    sizes = local_batch_sizes(batch_size, len(widths))
    width = widths[rank]
    if check:
        send = pooled_output(rank, width, batch_size, device)
    else:
        send = torch.randn(batch_size, width, device=device)
    fwd_in = [sizes[j] * width for j in range(len(widths))]  # rows of slice j, contiguous in [B, width]
    fwd_out = [sizes[rank] * w for w in widths]
    recv = torch.empty(sum(fwd_out), device=device)
    dist.all_to_all_single(recv, send.reshape(-1), fwd_out, fwd_in)
    correct = None
    if check:
        pieces = torch.split(recv, fwd_out)
        got = torch.cat([p.reshape(sizes[rank], w) for p, w in zip(pieces, widths)], dim=1)
        correct = bool(torch.equal(got, expected_received(widths, batch_size, rank, device)))
    return send, recv, fwd_in, fwd_out, correct


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_layouts(
    rank: int, layouts: Sequence[Sequence[int]], batch_size: int, device: torch.device, warmup_iters: int,
    iters: int, check: bool,
) -> list[dict[str, Any]]:
    """This rank's stamps of every layout's timed exchanges (a rank of an initialised process group).

    The layouts take turns exchange by exchange (iteration i of every layout, then iteration i + 1): on a shared
    machine an exchange's time drifts by tens of percent over seconds, and layouts timed one after another, each
    for its own stretch of iterations, measured far apart on the same exchange (record `eval_comm_consistency`)."""
    buffers, checks = [], []
    for widths in layouts:
        send, recv, fwd_in, fwd_out, correct = _exchange(rank, widths, batch_size, device, check)
        grad_out = torch.empty_like(send).reshape(-1)  # backward: gradients of my slices go back
        buffers.append((send.reshape(-1), recv, grad_out, fwd_in, fwd_out))
        checks.append(correct)
    stamps: list[list[tuple[float, float, float, float]]] = [[] for _ in layouts]  # (fwd start, end, bwd start, end)
    for i in range(warmup_iters + iters):
        for k, (send, recv, grad_out, fwd_in, fwd_out) in enumerate(buffers):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process on the host
            dist.all_to_all_single(recv, send, fwd_out, fwd_in)
            _sync(device)
            t1 = time.perf_counter()
            dist.barrier()
            _sync(device)
            t2 = time.perf_counter()
            dist.all_to_all_single(grad_out, recv, fwd_in, fwd_out)
            _sync(device)
            t3 = time.perf_counter()
            if i >= warmup_iters:
                stamps[k].append((t0, t1, t2, t3))
    return [{"stamps": times, "received_bytes": recv.numel() * recv.element_size(), "correct": correct}
            for times, (_, recv, *_), correct in zip(stamps, buffers, checks, strict=True)]


#: the collectives `AllToAllSession.measure_collective` times, each of `size_bytes` fp32 per device: all_reduce (a
#: sum of size_bytes), reduce_scatter (size_bytes in, its 1 / D slice of the sum out), all_gather (a 1 / D slice in,
#: size_bytes out), all_to_all (size_bytes sent, 1 / D to each device)
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def _collective_call(op: str, size_bytes: int, world_size: int,
                     device: torch.device) -> tuple[Callable[[], object], Callable[[], object]]:
    """One collective of `size_bytes` per device: (the call to time, what to run after it, untimed)."""
    if op == "all_reduce":
        full = torch.ones(max(1, size_bytes // 4), device=device)
        return (lambda: dist.all_reduce(full)), (lambda: full.fill_(1.0))  # sums of sums would overflow to inf
    full = torch.ones(max(world_size, size_bytes // 4 // world_size * world_size), device=device)
    part = torch.ones(full.numel() // world_size, device=device)
    if op == "reduce_scatter":
        return (lambda: dist.reduce_scatter_single(part, full)), (lambda: None)
    if op == "all_gather":
        return (lambda: dist.all_gather_single(full, part)), (lambda: None)
    if op == "all_to_all":
        received = torch.empty_like(full)
        return (lambda: dist.all_to_all_single(received, full)), (lambda: None)
    raise ValueError(f"collective {op!r} is not one of {list(COLLECTIVES)}")


def _time_collectives(rank: int, op: str, sizes_bytes: Sequence[int], device: torch.device, warmup_iters: int,
                      iters: int) -> list[dict[str, Any]]:
    """This rank's stamps of every size's timed collectives `op`, the sizes taking turns as layouts do."""
    calls = [_collective_call(op, size, dist.get_world_size(), device) for size in sizes_bytes]
    stamps: list[list[tuple[float, float]]] = [[] for _ in sizes_bytes]
    for i in range(warmup_iters + iters):
        for k, (call, after) in enumerate(calls):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            call()
            _sync(device)
            t1 = time.perf_counter()
            if i >= warmup_iters:
                stamps[k].append((t0, t1))
            after()
    return [{"stamps": times} for times in stamps]


def _rank_main(rank: int, world_size: int, port: int, backend: str, jobs: Any, results: Any) -> None:
    """One rank of an `AllToAllSession`: joins the group, then times each job's layouts until told to stop."""
    torch.set_num_threads(1)  # D processes share the machine's cores
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    results.put((rank, READY))
    parent = os.getppid()
    try:
        while True:
            try:
                job = jobs.get(timeout=5.0)
            except queue.Empty:
                if os.getppid() != parent:  # the parent was killed: nobody will send the stop
                    return
                continue
            if job is None:
                return
            try:
                if job.get("op") in COLLECTIVES:
                    results.put((rank, _time_collectives(rank, job["op"], job["sizes_bytes"], device,
                                                         job["warmup_iters"], job["iters"])))
                else:
                    results.put((rank, _time_layouts(rank, device=device, **job)))
            except Exception as exc:  # reported to the parent, which stops every rank
                results.put((rank, f"{type(exc).__name__}: {exc}"))
                return
    finally:
        dist.destroy_process_group()


def _check_layouts(layouts: Sequence[Sequence[int]], num_devices: int, batch_size: int) -> None:
    for widths in layouts:
        if len(widths) != num_devices:
            raise ValueError(f"widths: every layout needs {num_devices} devices, got {list(widths)}")
        if any(w < 0 for w in widths):
            raise ValueError(f"widths must be >= 0, got {list(widths)}")
    if batch_size < num_devices:
        raise ValueError(f"batch_size {batch_size} is smaller than the number of devices {num_devices}")


class AllToAllSession:
    """D processes in one process group, kept for several measurements.

    Starting a process group costs seconds (spawning D interpreters that import torch); an exchange costs
    milliseconds. Entering the session waits until every rank has joined the group: ranks still importing torch
    would otherwise take the CPU from whatever the caller times next (refinement times kernels right after
    opening its session). A caller that measures a few layouts at a time, again and again (refinement, each round),
    keeps one session open: `with AllToAllSession(4) as session: session.measure(layouts, batch_size)`."""

    def __init__(self, num_devices: int, *, backend: str | None = None) -> None:
        if num_devices < 2:
            raise ValueError(f"widths: an all-to-all needs at least 2 devices, got {num_devices}")
        backend = backend or default_backend("cuda" if torch.cuda.is_available() else "cpu")
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend {backend!r} is not one of ['gloo', 'nccl']")
        if backend == "nccl" and torch.cuda.device_count() < num_devices:
            raise ValueError(f"backend 'nccl' needs {num_devices} GPUs, found {torch.cuda.device_count()}")
        self.num_devices, self.backend = num_devices, backend
        self._ranks: list[Any] = []

    def __enter__(self) -> AllToAllSession:
        context = mp.get_context("spawn")  # children must not inherit a CUDA context
        self._jobs = [context.Queue() for _ in range(self.num_devices)]
        self._results = context.Queue()
        port = _free_port()
        env_before = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # keep the children's thread pools small
        try:
            with main_module_hidden():
                for rank in range(self.num_devices):
                    process = context.Process(
                        target=_rank_main, daemon=True,
                        args=(rank, self.num_devices, port, self.backend, self._jobs[rank], self._results),
                    )
                    process.start()
                    self._ranks.append(process)
        except BaseException:
            self._stop(graceful=False)
            raise
        finally:
            if env_before is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env_before
        try:
            self._collect(lambda result: result == READY)
        except BaseException:
            self._stop(graceful=False)
            raise
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._stop(graceful=exc_type is None)

    def _stop(self, graceful: bool) -> None:
        """Ask every rank to leave (or, after a failure, terminate them), then reap them."""
        if graceful:
            for jobs, process in zip(self._jobs, self._ranks):
                if process.is_alive():
                    jobs.put(None)
            for process in self._ranks:
                process.join(timeout=60)
        for process in self._ranks:
            if process.is_alive():
                process.terminate()
            process.join(timeout=10)
        self._ranks = []

    def _fail(self, reported: str = "") -> NoReturn:
        """Stop every rank and raise: a rank that died names the failure (its peers only saw the connection
        close), else what a rank reported."""
        dead = sorted(((r, p.exitcode) for r, p in enumerate(self._ranks) if not p.is_alive()),
                      key=lambda d: d[1] == 0)  # a rank that crashed before one that left
        self._stop(graceful=False)
        if dead and (dead[0][1] or not reported):
            raise RuntimeError(f"all-to-all rank {dead[0][0]} exited with code {dead[0][1]}")
        raise RuntimeError(reported)

    def measure(
        self, layouts: Sequence[Sequence[int]], batch_size: int, *, warmup_iters: int = 3, iters: int = 10,
        check: bool = False,
    ) -> list[list[CommTiming]]:
        """Per-device all-to-all timings of each layout (its devices' pooled widths), in this session's group."""
        if not self._ranks:
            raise RuntimeError("AllToAllSession.measure needs an open session (use it in a `with` block)")
        _check_layouts(layouts, self.num_devices, batch_size)
        if not layouts:
            return []
        job = {"layouts": [list(map(int, w)) for w in layouts], "batch_size": batch_size,
               "warmup_iters": warmup_iters, "iters": iters, "check": check}
        for jobs in self._jobs:
            jobs.put(job)
        per_rank = self._collect(lambda result: not isinstance(result, str))
        return [_timings([per_rank[r][k] for r in range(self.num_devices)]) for k in range(len(layouts))]

    def measure_all_reduce(self, sizes_bytes: Sequence[int], *, warmup_iters: int = 3,
                           iters: int = 10) -> list[tuple[float, ...]]:
        """Per size, every timed all-reduce's ms over this session's devices (`measure_collective`)."""
        return self.measure_collective("all_reduce", sizes_bytes, warmup_iters=warmup_iters, iters=iters)

    def measure_collective(self, op: str, sizes_bytes: Sequence[int], *, warmup_iters: int = 3,
                           iters: int = 10) -> list[tuple[float, ...]]:
        """Per size, every timed collective `op` (one of COLLECTIVES, `size_bytes` fp32 per device)'s ms over this
        session's devices: from the last rank's start to the last rank's end (the step waits for the slowest), the
        sizes taking turns collective by collective."""
        if not self._ranks:
            raise RuntimeError("AllToAllSession.measure_collective needs an open session (use it in a `with` block)")
        if op not in COLLECTIVES:
            raise ValueError(f"collective {op!r} is not one of {list(COLLECTIVES)}")
        if any(size < 4 for size in sizes_bytes):
            raise ValueError(f"sizes_bytes: an {op} of fp32 needs at least 4 bytes, got {list(sizes_bytes)}")
        if not sizes_bytes:
            return []
        job = {"op": op, "sizes_bytes": [int(s) for s in sizes_bytes], "warmup_iters": warmup_iters, "iters": iters}
        for jobs in self._jobs:
            jobs.put(job)
        per_rank = self._collect(lambda result: not isinstance(result, str))
        out = []
        for k in range(len(sizes_bytes)):
            stamps = [per_rank[r][k]["stamps"] for r in range(self.num_devices)]
            out.append(tuple(max(0.0, max(s[i][1] for s in stamps) - max(s[i][0] for s in stamps)) * 1e3
                             for i in range(len(stamps[0]))))
        return out

    def _collect(self, expected: Callable[[Any], bool]) -> dict[int, Any]:
        """Every rank's next report, by rank; a rank that died, or reported what `expected(result)` refuses
        (an error), stops the session."""
        per_rank: dict[int, Any] = {}
        while len(per_rank) < self.num_devices:
            try:
                rank, result = self._results.get(timeout=1.0)
            except queue.Empty:
                if any(not p.is_alive() for p in self._ranks):
                    self._fail()
                continue
            if not expected(result):
                self._fail(f"all-to-all rank {rank} failed: {result}")
            per_rank[rank] = result
        return per_rank


def measure_all_to_all_many(
    layouts: Sequence[Sequence[int]],
    batch_size: int,
    *,
    backend: str | None = None,
    warmup_iters: int = 3,
    iters: int = 10,
    check: bool = False,
) -> list[list[CommTiming]]:
    """Per-device all-to-all timings of several layouts with the same device count, in one process group."""
    if not layouts:
        return []
    _check_layouts(layouts, len(layouts[0]), batch_size)  # before seconds are spent starting the group
    with AllToAllSession(len(layouts[0]), backend=backend) as session:
        return session.measure(layouts, batch_size, warmup_iters=warmup_iters, iters=iters, check=check)


def measure_comm_group(
    num_devices: int,
    layouts: Sequence[Sequence[int]],
    batch_size: int,
    collectives: Sequence[tuple[str, int]] = (),
    *,
    backend: str | None = None,
    warmup_iters: int = 3,
    iters: int = 10,
) -> tuple[list[list[CommTiming]], list[tuple[float, ...]]]:
    """All-to-all layouts and collectives ((op, size_bytes): all-reduces, reduce-scatters) over `num_devices`
    processes in one group (spawning one costs seconds): the layouts' per-device timings and each collective's
    timed ms, in the order given."""
    _check_layouts(layouts, num_devices, batch_size)
    if not layouts and not collectives:
        return [], []
    by_op: dict[str, list[int]] = {}
    for k, (op, _) in enumerate(collectives):
        by_op.setdefault(op, []).append(k)
    timed: list[tuple[float, ...]] = [() for _ in collectives]
    with AllToAllSession(num_devices, backend=backend) as session:
        timings = session.measure(layouts, batch_size, warmup_iters=warmup_iters, iters=iters) if layouts else []
        for op, members in by_op.items():
            sizes = [collectives[k][1] for k in members]
            for k, samples in zip(members, session.measure_collective(op, sizes, warmup_iters=warmup_iters,
                                                                      iters=iters), strict=True):
                timed[k] = samples
    return timings, timed

def _timings(ranks: Sequence[dict]) -> list[CommTiming]:
    """Per-rank medians of one layout, each exchange timed from the last rank's start to this rank's end."""
    stamps = [r["stamps"] for r in ranks]
    out = []
    for r, rank in enumerate(ranks):
        fwd, bwd = [], []
        for i, (_, t1, _, t3) in enumerate(stamps[r]):
            fwd_start = max(s[i][0] for s in stamps)
            bwd_start = max(s[i][2] for s in stamps)
            # clamped: a rank cannot finish before the last one started, up to clock resolution
            fwd.append(max(t1 - fwd_start, 0.0) * 1e3)
            bwd.append(max(t3 - bwd_start, 0.0) * 1e3)
        out.append(
            CommTiming(
                fwd_ms=statistics.median(fwd),
                bwd_ms=statistics.median(bwd),
                received_bytes=rank["received_bytes"],
                correct=rank["correct"],
                fwd_samples_ms=tuple(fwd),
                bwd_samples_ms=tuple(bwd),
            )
        )
    return out


def measure_all_to_all(
    widths: Sequence[int],
    batch_size: int,
    *,
    backend: str | None = None,
    warmup_iters: int = 3,
    iters: int = 10,
    check: bool = False,
) -> list[CommTiming]:
    """Per-device forward/backward ms of the table-wise all-to-all for per-device output `widths`."""
    return measure_all_to_all_many(
        [widths], batch_size, backend=backend, warmup_iters=warmup_iters, iters=iters, check=check
    )[0]


def measure_all_reduce(
    sizes_bytes: Sequence[int], num_devices: int, *, backend: str | None = None, warmup_iters: int = 3,
    iters: int = 10,
) -> list[float]:
    """Median ms of an fp32 sum all-reduce of each of `sizes_bytes` over `num_devices` processes (one group)."""
    with AllToAllSession(num_devices, backend=backend) as session:
        timed = session.measure_all_reduce(sizes_bytes, warmup_iters=warmup_iters, iters=iters)
    return [statistics.median(samples) for samples in timed]
