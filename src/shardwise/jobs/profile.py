"""`shardwise profile`: measure sampled shards, all-to-all layouts and the collectives of data-parallel and row-wise
tables, and data-parallel tables' dense kernels, into a cost dataset (resumable)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from pydantic import Field, model_validator

from shardwise.errors import ShardwiseError
from shardwise.profiling import DeviceName, ProfileSettings, TimingProtocol
from shardwise.profiling.budget import floor_shards, rate_line
from shardwise.profiling.protocol import CUDA_TIMER_HELP, CudaTimer, MeasurementSettings
from shardwise.profiling.run_settings import NEEDS_CUDA
from shardwise.workload import Optimizer, TableSet, WeightsPrecision, load_tables, read_dlrm_dataset

from .base import JobResult, JobSettings

_PROFILER = ProfileSettings.model_fields  # the profiler's own defaults, shared rather than repeated
#: your own tables' heaviest seed this share of the shards: on the MLPerf DLRM-DCNv2 tables it lowered the error on
#: fresh shards holding the heaviest three from 10.4% to 5.9-6.6% MAPE (with augmentation covering their extremes)
HEAVY_SHARE_GIVEN = 0.2
#: a budgeted run measures at least this share of --num-shards, however slow the machine (what keeps the cost
#: model's held-out error in bounds), and says so in one line when that overruns the budget
BUDGET_FLOOR_SHARE = 0.5
_TIMING = TimingProtocol.model_fields


class ProfileJobSettings(JobSettings):
    """What to measure (shards of which tables, how many) and how (device, timing protocol)."""

    tables: str = Field(description="shardwise.tables/v1 file to sample shards from")
    out: str = Field(description="cost dataset to append to: a directory of Parquet part files, or an object-store "
                     "prefix s3://bucket/prefix (one per hardware kind); reruns resume")
    indices: str | None = Field(default=None, description="index data in the DLRM dataset format (default: sampled)")
    num_shards: int = Field(default=100, ge=0, description="shard configurations to measure")
    budget_s: float | None = Field(
        default=None, gt=0,
        description="start no new shard after this many seconds, once "
                    f"{BUDGET_FLOOR_SHARE:g} of --num-shards are stored (a slower machine measures fewer; the same "
                    "command again measures more; default: every shard)")
    comm_layouts: int = Field(default=_PROFILER["comm_layouts"].default, ge=0, description="all-to-all layouts to measure")
    all_reduce_max_bytes: int = Field(
        default=_PROFILER["all_reduce_max_bytes"].default, ge=0,
        description="with --comm-layouts: all-reduces, reduce-scatters, all-gathers and all-to-alls of 4 KiB, 16 KiB, "
                    "... up to this many bytes over each device count (data-parallel tables' gradients, row-wise "
                    "tables' outputs, gradients and ids; 0: none)")
    data_parallel_shards: int = Field(
        default=_PROFILER["data_parallel_shards"].default, ge=0,
        description="the first this many shards also timed as data-parallel tables: TorchRec's dense kernel at the "
                    "local batch of 2, 4 and 8 devices (what prices data-parallel tables' kernels; 0: none)")
    row_wise_shards: int = Field(
        default=_PROFILER["row_wise_shards"].default, ge=0,
        description="the first this many shards also timed as row-wise tables: their tables' row blocks over 2, 4 "
                    "and 8 devices, at the batch (what the compute network prices row-wise tables by; 0: none)")
    caching_shards: int = Field(
        default=_PROFILER["caching_shards"].default, ge=0,
        description="the first this many shards also timed with their tables in host memory on fbgemm's UVM (CUDA "
                    "only): all cached, half cached beside HBM tables, at each --cache-load-factors, and uncached "
                    "(fused_uvm); caches warmed to a steady hit rate (0: none)")
    cache_load_factors: tuple[float, ...] = Field(
        default=_PROFILER["cache_load_factors"].default, min_length=1, json_schema_extra={"sep": ","},
        description="comma-separated shares of a table's rows its HBM cache holds, for --caching-shards")
    max_tables: int = Field(default=_PROFILER["max_tables"].default, ge=1, description="most tables in one shard")
    heavy_share: float | None = Field(
        default=None, ge=0, le=1,
        description="share of shards seeded with the tables' heaviest tenth by pooling x (dim + 16), in turn, a third "
                    f"of them alone (the tables that set a plan's slowest device; default: {HEAVY_SHARE_GIVEN} where "
                    "the tables are your own, the workload's --tables, else none)")
    repeats: int = Field(default=_PROFILER["repeats"].default, ge=0,
                         description="re-measure some shards this many more times")
    repeat_shards: int = Field(default=_PROFILER["repeat_shards"].default, ge=0,
                               description="how many shards get repeats")
    seed: int = 0
    device: DeviceName = Field(default=None, description="cpu, cuda, cuda:N (default: cuda when present)")
    batch_size: int | None = Field(default=None, ge=1, description="default: the table file's batch size")
    optimizer: Optimizer = _PROFILER["optimizer"].default
    weights_precision: WeightsPrecision = _PROFILER["weights_precision"].default
    memory_cap_bytes: int | None = Field(default=None, ge=1, description="per shard (default: 1 GiB on CPU)")
    max_devices: int | None = Field(default=None, ge=2, description="largest all-to-all (default: GPUs or 4)")
    warmup_iters: int | None = Field(default=None, ge=0,
                                     description=MeasurementSettings.model_fields["warmup_iters"].description)
    timing_iters: int = Field(default=_TIMING["iters"].default, ge=1, description="timed kernel iterations per shard")
    threads: int = Field(default=_TIMING["num_threads"].default, ge=1,
                         description="CPU threads per measurement (one device)")
    cuda_timer: CudaTimer | None = Field(default=None, description=CUDA_TIMER_HELP)
    worker: int = Field(default=_PROFILER["worker"].default, ge=0,
                        description="this worker's slice of the run (0 .. workers-1): K profiling pods with the same "
                                    "settings and dataset measure it once between them")
    workers: int = Field(default=_PROFILER["workers"].default, ge=1, description="workers splitting the run")
    no_reference_normalisation: bool = Field(
        default=False, description="report raw medians (normalisation is on by default on CPU, off on CUDA)"
    )

    @model_validator(mode="after")
    def _measures_something(self) -> ProfileJobSettings:
        if self.num_shards == 0 and self.comm_layouts == 0:
            raise ValueError("num_shards and comm_layouts are both 0: nothing to measure")
        if self.worker >= self.workers:
            raise ValueError(f"worker {self.worker} is not one of 0..{self.workers - 1} (workers {self.workers})")
        if any(not 0.0 < f <= 1.0 for f in self.cache_load_factors):
            raise ValueError(f"cache_load_factors {list(self.cache_load_factors)}: each is a share of a table's rows, "
                             "in (0, 1]")
        if self.caching_shards and self.device is not None and not str(self.device).startswith("cuda"):
            raise ValueError(NEEDS_CUDA)
        return self


class ProfileResult(JobResult):
    """What the run measured and what the dataset holds now."""

    out: str
    measured: int
    skipped: int
    total_rows: int
    hardware_kind: str
    reference_ms: float | None
    noise_floor: dict[str, float] | None = None
    shards: int = 0  # whole shards this run measured
    shards_left: int = 0  # left by the time budget, for a rerun
    elapsed_s: float = 0.0

    def summary(self) -> str:
        """Rows measured and stored, the shards' rate; the noise floor when repeats were asked for."""
        line = (
            f"{self.out}: {self.measured} measured, {self.skipped} already stored, {self.total_rows} rows "
            f"({self.hardware_kind}, reference {self.reference_ms or float('nan'):.3f} ms)"
        )
        if self.shards:
            line += "\n" + rate_line(self.shards, self.elapsed_s, self.shards_left)
            line += ": the same command again measures them" if self.shards_left else ""
        if self.noise_floor:
            f = self.noise_floor
            line += (
                f"\nnoise floor over {int(f['configs'])} repeated shards: median relative deviation "
                f"{f['median_rel_dev']:.1%}, spread median {f['median_spread']:.1%} max {f['max_spread']:.1%}"
            )
        return line


class ProfileInterrupted(ShardwiseError):
    """Ctrl-C or SIGTERM during profiling: what was measured is stored, a rerun measures the rest."""

    exit_code = 130  # the shell's status for a process ended by SIGINT


def run(settings: ProfileJobSettings, *, progress: bool = True, say_floor: bool = True) -> ProfileResult:
    """Sample shard configurations from the tables and measure them on this machine's kernels (`say_floor`: a line
    where a time budget cannot hold the floor of shards)."""
    # the profiling run and the dataset (torch, pandas) load only when it runs: `profile --help` answers without them
    from shardwise.profiling import load_costs, noise_floor, profile

    tableset = load_tables(settings.tables)
    index_data = None
    if settings.indices:
        index_data = read_dlrm_dataset(settings.indices).index_data
        missing = sorted({t.source or t.name for t in tableset.tables} - set(index_data))
        if missing:
            raise ShardwiseError(f"--indices {settings.indices}: no index data for table(s) {missing[:5]}")
    profiler = ProfileSettings(
        num_shards=settings.num_shards,
        comm_layouts=settings.comm_layouts,
        all_reduce_max_bytes=settings.all_reduce_max_bytes,
        data_parallel_shards=settings.data_parallel_shards,
        row_wise_shards=settings.row_wise_shards,
        caching_shards=settings.caching_shards,
        cache_load_factors=settings.cache_load_factors,
        max_tables=settings.max_tables,
        heavy_share=heavy_share(settings, tableset),
        repeats=settings.repeats,
        repeat_shards=settings.repeat_shards,
        seed=settings.seed,
        budget_s=settings.budget_s,
        floor_shards=floor_shards(settings.num_shards, BUDGET_FLOOR_SHARE) if settings.budget_s else 0,
        device=settings.device,
        batch_size=settings.batch_size or tableset.batch_size,
        optimizer=settings.optimizer,
        weights_precision=settings.weights_precision,
        memory_cap_bytes=settings.memory_cap_bytes,
        max_devices=settings.max_devices,
        worker=settings.worker,
        workers=settings.workers,
        protocol=TimingProtocol(
            warmup_iters=settings.warmup_iters,
            iters=settings.timing_iters,
            num_threads=settings.threads,
            cuda_timer=settings.cuda_timer,
            reference_normalised=False if settings.no_reference_normalisation else None,
        ),
    )
    try:
        summary = profile(tableset.tables, settings.out, profiler, index_data=index_data, progress=progress,
                          say_floor=say_floor)
    except ValueError as err:  # settings the sampler or the device refuses (e.g. max_devices > cores)
        raise ShardwiseError(str(err)) from None
    except KeyboardInterrupt:
        raise ProfileInterrupted(
            f"interrupted; what was measured is stored in {settings.out}; rerun the same command to measure the rest"
        ) from None
    floor = None
    if settings.repeats:
        floor = {k: float(v) for k, v in noise_floor(load_costs(settings.out).query("kind == 'compute'")).items()}
    return ProfileResult(
        out=settings.out, measured=summary.measured, skipped=summary.skipped, total_rows=summary.total_rows,
        hardware_kind=summary.hardware_kind, reference_ms=summary.reference_ms, noise_floor=floor,
        shards=summary.shards, shards_left=summary.shards_left, elapsed_s=summary.elapsed_s,
    )


def heavy_share(settings: ProfileJobSettings, tableset: TableSet) -> float:
    """The share of shards seeded with the heaviest tables: as set, else `HEAVY_SHARE_GIVEN` for your own tables."""
    if settings.heavy_share is not None:
        return settings.heavy_share
    return HEAVY_SHARE_GIVEN if tableset.given else 0.0


def run_apart(settings: ProfileJobSettings, holdout_tables: str, holdout_shards: int) -> ProfileResult:
    """Profile `settings.tables` (and the all-to-alls), then `holdout_shards` shards built only from the held-out
    tables (seed + 1) into the same dataset: profiled apart, held-out tables never share a shard with training
    tables, so `pretrain --holdout-tables` trains on every training shard and evaluates on every held-out one.
    Row blocks and dense kernels are taken of the held-out shards in the training profile's proportion (at least one
    where it takes any), so pretrain's report has their error on held-out tables beside the whole shards'."""
    if holdout_shards < 1:
        raise ShardwiseError(
            f"holdout_shards {holdout_shards}: pretrain evaluates (and its promotion gate compares) on shards of "
            "held-out tables; profile at least 1 (20 or more for meaningful metrics)"
        )
    budget_s = settings.budget_s
    if budget_s is not None:  # the training shards' share of the budget; the held-out ones get what is left
        settings = settings.model_copy(update={
            "budget_s": budget_s * settings.num_shards / (settings.num_shards + holdout_shards)})
    trained = run(settings)
    spent = settings.budget_s is not None and trained.elapsed_s >= settings.budget_s
    # all-to-alls depend on widths, not on which tables: measured once, in the first call
    heldout = run(settings.model_copy(update={
        "tables": holdout_tables, "num_shards": holdout_shards, "comm_layouts": 0,
        "budget_s": None if budget_s is None else max(budget_s - trained.elapsed_s, 1e-6),  # spent: the floor
        **{key: math.ceil(getattr(settings, key) * holdout_shards / max(settings.num_shards, 1))
           for key in ("data_parallel_shards", "row_wise_shards", "caching_shards")},
        "seed": settings.seed + 1,
        "heavy_share": 0.0,  # the held-out shards stay a plain sample: their error is what pretrain reports
    }), say_floor=not spent)  # a training part past its budget said the floor's overrun already
    return heldout.model_copy(update={
        "measured": trained.measured + heldout.measured, "skipped": trained.skipped + heldout.skipped,
        "shards": trained.shards + heldout.shards, "shards_left": trained.shards_left + heldout.shards_left,
        "elapsed_s": trained.elapsed_s + heldout.elapsed_s})


def resume_directory(store: str | Path, settings: ProfileJobSettings, holdout_tables: str, holdout_shards: int) -> Path:
    """The dataset inside `store` (a local pipeline run's profile store) that `run_apart` with these settings resumes
    and adds to: the same tables, held-out tables and counts share it whatever the time budget (a run the budget cut
    short leaves shards the next one measures); any other setting gets its own."""
    digest = hashlib.sha256()
    for path in (settings.tables, holdout_tables):
        digest.update(Path(path).read_bytes() + b"\0")
    fields = settings.model_dump(mode="json", exclude={"tables", "out", "budget_s"})
    digest.update(json.dumps([fields, holdout_shards], sort_keys=True, default=str).encode())
    return Path(store) / digest.hexdigest()[:16]
