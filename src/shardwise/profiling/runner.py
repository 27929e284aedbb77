"""`shardwise profile`: sample shard configurations and all-to-all layouts, measure them (and, beside the
layouts, all-reduces of a range of sizes over each device count; the first shards' dense kernels at each device
count's local batch, as data-parallel tables; and the first shards' row blocks, as row-wise tables leave them on a
device), append to a dataset.

Resumable: every measurement has a stable key (config id, repeat); rows are flushed every `chunk_size` rows,
after each all-to-all group and on an interrupt, each flush one new part file of the dataset directory (see
`dataset`), and a rerun with the same arguments measures only what the dataset lacks. Several processes may
append to one dataset at once: none rewrites another's parts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from shardwise.errors import ServiceError, redacted
from shardwise.workload import TableSpec, local_batch, row_blocks

from .batches import IndexData
from .budget import ShardClock
from .caching import NEEDS_CUDA, CachingNeedsCudaError, caching_variants
from .comm import default_backend, measure_comm_group
from .dataset import (
    count_rows,
    is_object_store,
    load_stored,
    prepare_dataset,
    write_part,
)
from .hardware import hardware_info, resolve_device
from .interrupts import interrupts_deferred, sigterm_as_interrupt
from .kernel import TimingProtocol, calibrate_reference, measure_shards
from .rows import FORWARD_COLLECTIVES, collective_row, comm_rows, compute_row
from .run_settings import ProfileSettings
from .sampling import (
    all_reduce_sizes,
    collective_config_id,
    comm_config_id,
    comm_device_counts,
    config_id,
    default_max_devices,
    sample_comm_layouts,
    sample_shard_configs,
    shard_config_id,
)

#: a shard's state must fit comfortably in host memory next to other jobs on a laptop or CI machine
DEFAULT_CPU_MEMORY_CAP_BYTES = 1 << 30


#: the collectives profiled beside the all-to-all layouts, each at every size of `all_reduce_sizes`: data-parallel
#: gradients' all-reduce, row-wise tables' outputs' reduce-scatter, their gradients' all-gather and their ids' even
#: all-to-all (the reduce-scatter's line prices the other two badly, so each is measured)
PROFILED_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
#: the device counts whose local batches data-parallel kernels are profiled at (a kernel depends on D only through
#: its batch, so these need no process group: a pod of one GPU profiles them too)
DATA_PARALLEL_DEVICE_COUNTS = (2, 4, 8)
#: the device counts whose row blocks are profiled: a row-wise table leaves each device a block of ceil(rows / D)
#: rows and the lookups that fall in it (`TableSpec.row_block`), a table the compute network must price at pooling
#: factor / D; trained on whole tables only, it priced such blocks far worse (record `row_block_accuracy`)
ROW_WISE_DEVICE_COUNTS = (2, 4, 8)

#: the names callers import from here: this module's own, and the rows' they use beside them
__all__ = [
    "DATA_PARALLEL_DEVICE_COUNTS",
    "DEFAULT_CPU_MEMORY_CAP_BYTES",
    "FORWARD_COLLECTIVES",
    "PROFILED_COLLECTIVES",
    "ROW_WISE_DEVICE_COUNTS",
    "ProfileSettings",
    "ProfileSummary",
    "_schedule",
    "compute_row",
    "measure_comm_group",
    "measure_shards",
    "profile",
]


@dataclass(frozen=True)
class ProfileSummary:
    """What a profile run did."""

    measured: int  # measurements taken in this run (an all-to-all layout counts once)
    skipped: int  # already in the dataset
    total_rows: int  # rows in the dataset afterwards (other writers' rows included)
    hardware_kind: str
    reference_ms: float | None
    shards: int = 0  # whole sampled shards measured in this run
    shards_left: int = 0  # of this worker's, left unmeasured by the time budget
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class _Job:
    index: int  # which sampled config
    repeat: int


def _schedule(num_configs: int, repeats: int, repeat_shards: int) -> list[_Job]:
    """All first measurements, with each repeat round of the first `repeat_shards` configs spread in between."""
    first = [_Job(i, 0) for i in range(num_configs)]
    subset = range(min(repeat_shards, num_configs))
    if repeats == 0 or not subset:
        return first
    # R + 1 blocks of first measurements with a repeat round after each of the first R blocks
    block = -(-num_configs // (repeats + 1))
    jobs: list[_Job] = []
    for r in range(repeats + 1):
        jobs.extend(first[r * block : (r + 1) * block])
        if r < repeats:
            jobs.extend(_Job(i, r + 1) for i in subset)
    return jobs


def _memory_cap(settings: ProfileSettings, device: torch.device) -> int:
    if settings.memory_cap_bytes is not None:
        return settings.memory_cap_bytes
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 4
    return DEFAULT_CPU_MEMORY_CAP_BYTES


def _reuse_reference_ms(stored: pd.DataFrame | None, hardware_kind: str, timing: str) -> float | None:
    """The calibrated reference ms of an earlier session of this dataset with the same hardware and protocol."""
    if stored is None or stored.empty:
        return None
    same = stored[
        (stored["kind"] == "compute")
        & (stored["hardware_kind"] == hardware_kind)
        & (stored["timing"] == timing)
        & stored["reference_ms"].notna()
    ]
    return float(same["reference_ms"].iloc[0]) if not same.empty else None


class _RowBuffer:
    """Rows waiting to be appended; flushed every `chunk_size` rows and on exit (also when interrupted)."""

    def __init__(self, out: str | Path, chunk_size: int, stored_rows: int = 0) -> None:
        self.out, self.chunk_size = out, chunk_size
        self.rows: list[dict[str, Any]] = []
        self.stored_rows = stored_rows  # in the dataset before this run
        self.written = 0  # rows this run has stored

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        self.rows.extend(rows)
        if len(self.rows) >= self.chunk_size:
            self.flush()

    def flush(self) -> None:
        # a signal waits until the part is written and the buffer emptied: rows are stored exactly once
        with interrupts_deferred():
            try:
                write_part(self.out, self.rows)
            except ServiceError as err:
                # the store went away: every part written before is whole and stays; say what is safe, and drop
                # the rows it refused (no second wait for the store on the way out; the rerun measures them)
                pending, self.rows = len(self.rows), []
                raise type(err)(
                    f"{err}; {self.stored_rows + self.written} rows are safe in {redacted(str(self.out))} "
                    f"({self.written} stored by this run, {pending} measured since were not): rerun the same "
                    "command to measure only the rest"
                ) from None
            self.written += len(self.rows)
            self.rows = []



@dataclass(frozen=True)
class _Work:
    """A run's sampled configs and their ids; of this worker's slice of them (`jobs`, `*_mine`), those the dataset
    lacks (`todo`, `*_todo`)."""

    configs: list[list[TableSpec]]  # the sampled shards, then the first ones' row blocks
    ids: list[str]
    source: list[int]  # the sampled shard each config was made of (a sampled shard: its own index)
    jobs: list[_Job]
    todo: list[_Job]
    backend: str
    layouts: list[list[int]]
    layout_ids: list[str]
    comm_mine: list[int]
    comm_todo: list[int]
    reduces: list[tuple[str, int, int]]  # (op, num_devices, size_bytes)
    reduce_ids: list[str]
    reduce_mine: list[int]
    reduce_todo: list[int]
    dense: list[tuple[int, int, int]]  # (config index, device count, repeat)
    dense_ids: list[str]
    dense_mine: list[int]
    dense_todo: list[int]

    @property
    def pending(self) -> int:
        """Measurements left to take."""
        return len(self.todo) + len(self.dense_todo) + len(self.comm_todo) + len(self.reduce_todo)

    @property
    def skipped(self) -> int:
        """This worker's measurements already in the dataset."""
        return (len(self.jobs) - len(self.todo) + len(self.comm_mine) - len(self.comm_todo) + len(self.reduce_mine)
                - len(self.reduce_todo) + len(self.dense_mine) - len(self.dense_todo))


def profile(
    tables: Sequence[TableSpec],
    out: str | Path,
    settings: ProfileSettings,
    *,
    index_data: IndexData | None = None,
    progress: bool = True,
    say_floor: bool = True,
) -> ProfileSummary:
    """Measure sampled shards (and all-to-all layouts) on `settings.device`; append rows to the dataset `out`
    (a directory of Parquet part files, or an object-store prefix). With a time budget, `say_floor` prints one line
    where the floor of shards overruns it."""
    out = out if is_object_store(out) else Path(out)
    device = resolve_device(settings.device)
    if settings.caching_shards and device.type != "cuda":
        raise CachingNeedsCudaError(NEEDS_CUDA)
    protocol = settings.protocol.for_device(device)
    info = hardware_info(device)
    if device.type == "cpu" and protocol.num_threads is not None:
        info["num_threads"] = protocol.num_threads
    kind = info["hardware_kind"]
    timing = protocol.settings_json()
    stored = load_stored(out)
    done = set() if stored is None else set(zip(stored["config_id"].astype(str), stored["repeat"].astype(int)))
    work = _plan(tables, settings, device, kind, done)

    # one reference for every kernel of the dataset: a run with only dense kernels left (added to a profile, or
    # resumed in their repeats, which come last) reuses the stored one too, not one calibrated per device count
    if protocol.reference_normalised and protocol.reference_ms is None and (work.todo or work.dense_todo):
        reused = _reuse_reference_ms(stored, kind, timing)
        protocol = protocol.model_copy(update={"reference_ms": reused or calibrate_reference(device, protocol)})

    if work.pending:
        prepare_dataset(out)  # before measuring: a path that cannot hold the dataset fails now, not at the end
    common = {**info, "batch_size": settings.batch_size}
    buffer = _RowBuffer(out, settings.chunk_size, 0 if stored is None else len(stored))
    whole = [j for j in work.todo if _whole(work, j)]
    stored_whole = sum(_whole(work, j) for j in work.jobs) - len(whole)
    floor = -(-settings.floor_shards // settings.workers)  # this worker's share of the run's floor
    clock = ShardClock(settings.budget_s, max(0, floor - stored_whole),
                       say=tqdm.write if say_floor else None)
    measured = _measure(work, settings, device, protocol, index_data, common, timing, buffer, progress, clock)
    return ProfileSummary(
        measured=measured,
        skipped=work.skipped,
        total_rows=count_rows(out),
        hardware_kind=kind,
        reference_ms=protocol.reference_ms,
        shards=clock.shards,
        shards_left=len(whole) - clock.shards,
        elapsed_s=clock.elapsed_s,
    )


def _whole(work: _Work, job: _Job) -> bool:
    """A sampled shard's first measurement (not one of its row blocks or caching variants, nor a repeat)."""
    return job.repeat == 0 and work.source[job.index] == job.index


def _plan(tables: Sequence[TableSpec], settings: ProfileSettings, device: torch.device, kind: str,
          done: set[tuple[str, int]]) -> _Work:
    """Sample the run's shards, layouts and collective sizes, and pick this worker's slice of them that `done` (the
    dataset's (config id, repeat)) lacks."""
    sampled = sample_shard_configs(
        tables,
        settings.num_shards,
        batch_size=settings.batch_size,
        seed=settings.seed,
        max_tables=settings.max_tables,
        memory_cap_bytes=_memory_cap(settings, device),
        heavy_share=settings.heavy_share,
        optimizer=settings.optimizer,
        weights_precision=settings.weights_precision,
    )
    # the first shards again as row-wise tables leave them on the first device of each count (its row blocks)
    configs = sampled + [row_blocks(shard, count)[0] for count in ROW_WISE_DEVICE_COUNTS
                         for shard in sampled[: settings.row_wise_shards]]
    # and again in host memory, behind caches of each load factor and without one
    configs += [variant for shard in sampled[: settings.caching_shards]
                for variant in caching_variants(shard, settings.cache_load_factors)]
    source = (list(range(len(sampled)))
              + [i for _ in ROW_WISE_DEVICE_COUNTS for i in range(len(sampled[: settings.row_wise_shards]))]
              + [i for i, shard in enumerate(sampled[: settings.caching_shards])
                 for _ in caching_variants(shard, settings.cache_load_factors)])
    ids = [
        shard_config_id(c, settings.batch_size, settings.optimizer, settings.weights_precision, kind)
        for c in configs
    ]
    jobs = _schedule(len(configs), settings.repeats, settings.repeat_shards)
    # a config sampled twice is one config_id: measured once per repeat (as a resumed run, which skips it, would)
    keys = {(ids[j.index], j.repeat): j for j in reversed(jobs)}
    jobs = [j for j in jobs if keys[(ids[j.index], j.repeat)] is j]
    jobs = [j for j in jobs if j.index % settings.workers == settings.worker]  # this worker's slice
    todo = [j for j in jobs if (ids[j.index], j.repeat) not in done]
    if settings.budget_s is not None:  # a budget cuts between whole shards: each one's blocks and variants with it
        todo.sort(key=lambda j: (j.repeat, source[j.index], j.index))

    backend = default_backend(device.type)
    max_devices = settings.max_devices or default_max_devices(device.type)
    layouts = (
        sample_comm_layouts(
            settings.comm_layouts,
            dims=sorted({t.dim for t in tables}),
            seed=settings.seed + 1,
            max_devices=max_devices,
            max_tables_per_device=settings.max_tables,
        )
        if settings.comm_layouts
        else []
    )
    layout_ids = [comm_config_id(w, settings.batch_size, backend, kind) for w in layouts]
    comm_mine = [k for k in range(len(layout_ids)) if k % settings.workers == settings.worker]
    comm_todo = [k for k in comm_mine if (layout_ids[k], 0) not in done]
    # all-reduces (data-parallel gradients) and the row-wise collectives, of the same sizes
    reduces = [(op, count, size) for count in (comm_device_counts(max_devices) if settings.comm_layouts else [])
               for op in PROFILED_COLLECTIVES for size in all_reduce_sizes(settings.all_reduce_max_bytes)]
    reduce_ids = [collective_config_id(op, size, count, backend, kind) for op, count, size in reduces]
    reduce_mine = [k for k in range(len(reduces)) if k % settings.workers == settings.worker]
    reduce_todo = [k for k in reduce_mine if (reduce_ids[k], 0) not in done]
    # data-parallel tables: the first sampled shards' dense kernels at each device count's local batch, timed before
    # the shards; the first `repeat_shards` of them again `repeats` times after (their noise floor, over the run)
    dense_shards = min(settings.data_parallel_shards, len(sampled))
    dense = [(index, count, repeat) for repeat in range(settings.repeats + 1) for count in DATA_PARALLEL_DEVICE_COUNTS
             for index in range(dense_shards if repeat == 0 else min(settings.repeat_shards, dense_shards))]
    dense_ids = [config_id("data_parallel", ids[index], count) for index, count, _ in dense]
    dense_mine = [k for k in range(len(dense)) if k % settings.workers == settings.worker]
    dense_todo = [k for k in dense_mine if (dense_ids[k], dense[k][2]) not in done]
    return _Work(configs, ids, source, jobs, todo, backend, layouts, layout_ids, comm_mine, comm_todo, reduces,
                 reduce_ids, reduce_mine, reduce_todo, dense, dense_ids, dense_mine, dense_todo)


def _measure(work: _Work, settings: ProfileSettings, device: torch.device, protocol: TimingProtocol,
             index_data: IndexData | None, common: dict[str, Any], timing: str, buffer: _RowBuffer,
             progress: bool, clock: ShardClock) -> int:
    """Take the `work`'s measurements (the dense kernels' first round, the shards, the dense kernels' repeats, the
    collectives) into `buffer`, flushed however it ends; how many were taken. The shards stop where `clock` says
    the next would overrun its budget."""
    configs, dense, dense_ids = work.configs, work.dense, work.dense_ids
    measured = 0
    bar = tqdm(total=work.pending, desc="profile", unit="config", disable=not progress)
    try:
        with sigterm_as_interrupt():
            measured += _profile_dense(configs, dense, dense_ids, [k for k in work.dense_todo if dense[k][2] == 0],
                                       settings, device, protocol, index_data, common, timing, buffer, bar)
            clock.begin()
            # on a GPU the next shard's kernel is built while the device runs this one's timed calls
            timings = measure_shards([configs[job.index] for job in work.todo], settings.batch_size, device=device,
                                     protocol=protocol, optimizer=settings.optimizer,
                                     weights_precision=settings.weights_precision, index_data=index_data)
            for taken, (job, timing_result) in enumerate(zip(work.todo, timings), start=1):
                shard = configs[job.index]
                buffer.add([compute_row(shard, timing_result, config_id=work.ids[job.index], repeat=job.repeat,
                                        common=common, timing=timing, optimizer=settings.optimizer,
                                        weights_precision=settings.weights_precision, provenance="profile")])
                measured += 1
                bar.update()
                clock.measured(_whole(work, job))
                up_next = work.todo[taken] if taken < len(work.todo) else None
                if up_next is not None and _whole(work, up_next) and not clock.next_fits():
                    bar.total -= len(work.todo) - taken  # the budget's end, not a stall: the bar ends full
                    break
            measured += _profile_dense(configs, dense, dense_ids, [k for k in work.dense_todo if dense[k][2] > 0],
                                       settings, device, protocol, index_data, common, timing, buffer, bar)
            measured += _profile_comm(
                work.layouts, work.layout_ids, work.comm_todo,
                [(*work.reduces[k], work.reduce_ids[k]) for k in work.reduce_todo], settings, work.backend, common,
                buffer, bar
            )
    finally:
        bar.close()
        buffer.flush()
    return measured


def _profile_dense(configs: Sequence[Sequence[TableSpec]], dense: list[tuple[int, int, int]], dense_ids: list[str],
                   todo: list[int], settings: ProfileSettings, device: torch.device, protocol: TimingProtocol,
                   index_data: IndexData | None, common: dict[str, Any], timing: str, buffer: _RowBuffer,
                   bar: tqdm) -> int:
    """Time the `todo` dense kernels (`dense[k]`: the shard's config index, the device count whose local batch,
    the repeat), a device count at a time, as kind "data_parallel" rows; how many were timed."""
    for count in sorted({dense[k][1] for k in todo}):
        mine = [k for k in todo if dense[k][1] == count]
        timings = measure_shards([configs[dense[k][0]] for k in mine], local_batch(settings.batch_size, count),
                                 device=device, protocol=protocol, index_data=index_data, compute_kernel="dense")
        for k, timing_result in zip(mine, timings):
            row = compute_row(configs[dense[k][0]], timing_result, config_id=dense_ids[k], repeat=dense[k][2],
                              common=common, timing=timing, optimizer="sgd", weights_precision="fp32",
                              provenance="profile")
            buffer.add([{**row, "kind": "data_parallel", "num_devices": count}])
            bar.update()
    return len(todo)


def _profile_comm(
    layouts: list[list[int]],
    layout_ids: list[str],
    todo: list[int],
    reduces: list[tuple[str, int, int, str]],
    settings: ProfileSettings,
    backend: str,
    common: dict[str, Any],
    buffer: _RowBuffer,
    bar: tqdm,
) -> int:
    """Measure the layouts in `todo` and the collectives `reduces` ((op, num_devices, size_bytes, config id)), one
    process group per device count (spawning costs seconds)."""
    timing = json.dumps(
        {"warmup_iters": settings.comm_warmup_iters, "iters": settings.comm_iters, "barrier": True},
        sort_keys=True,
    )
    measured = 0
    for num_devices in sorted({len(layouts[k]) for k in todo} | {count for _, count, _, _ in reduces}):
        group = [k for k in todo if len(layouts[k]) == num_devices]
        sizes = [(op, size, cid) for op, count, size, cid in reduces if count == num_devices]
        # a group cannot be cut: interrupted while spawning, the parent would leave ranks waiting for a peer
        # that never comes (and wait for them at exit); so an interrupt waits for the group, whose rows are kept
        note = (f"interrupted: waiting for the {len(group)} all-to-all layout(s) and {len(sizes)} collective(s) "
                "(all-reduces, reduce-scatters, all-gathers, even all-to-alls) in flight (ranks cannot be cut)")
        with interrupts_deferred(note) as held:
            try:
                results, reduced = measure_comm_group(
                    num_devices,
                    [layouts[k] for k in group],
                    settings.batch_size,
                    [(op, size) for op, size, _ in sizes],
                    backend=backend,
                    warmup_iters=settings.comm_warmup_iters,
                    iters=settings.comm_iters,
                )
            except Exception:
                if held:  # Ctrl-C reached the ranks too (one process group) and they died of it
                    raise KeyboardInterrupt(f"signal {held[0]}") from None
                raise
            measured_at = time.time()
            for k, per_device in zip(group, results):
                rows = comm_rows(layouts[k], layout_ids[k], per_device, backend, common, timing, measured_at)
                buffer.add(rows)
            buffer.add([collective_row(op, num_devices, size, cid, samples, backend, common, timing, measured_at)
                        for (op, size, cid), samples in zip(sizes, reduced, strict=True)])
            buffer.flush()  # a group's rows are stored once measured: spawning the next group takes seconds
        measured += len(group) + len(sizes)
        bar.update(len(group) + len(sizes))
    return measured
