"""What one profile run measures and how (ProfileSettings), apart from the run (torch, pandas): `shardwise profile`'s
settings take their defaults from here, so its options (`profile --help`) are built without the kernels."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardwise.workload import Optimizer, WeightsPrecision

from .protocol import TimingProtocol

#: the one-line refusal where a shard in host memory is asked of a device without UVM
NEEDS_CUDA = ("fused_uvm_caching needs a CUDA device: profile on a GPU node "
              "(shardwise profile --device cuda --caching-shards N ...)")
#: the load factors a profile times caching shards at (`--cache-load-factors`): TorchRec's default 0.2 and either side
DEFAULT_CACHE_LOAD_FACTORS: tuple[float, ...] = (0.1, 0.2, 0.5)


class ProfileSettings(BaseModel):
    """What one `shardwise profile` run measures and how; the same settings resume the same run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_shards: int = Field(ge=0)
    comm_layouts: int = Field(default=0, ge=0)
    max_tables: int = Field(default=15, ge=1)
    #: the share of shards seeded with the population's heaviest tables, alone in a third of them
    #: (`sampling.sample_shard_configs`); 0 samples every shard alike
    heavy_share: float = Field(default=0.0, ge=0, le=1)
    #: re-measure `repeat_shards` of the configs this many more times, spread over the run (noise floor)
    repeats: int = Field(default=0, ge=0)
    repeat_shards: int = Field(default=10, ge=0)
    seed: int = 0
    device: str | None = None  # None: CUDA when available, else CPU
    batch_size: int = Field(ge=1)
    optimizer: Optimizer = "rowwise_adagrad"
    weights_precision: WeightsPrecision = "fp32"
    #: a sampled shard's weights + optimizer state + buffers stay under this (None: 1 GiB on CPU, 1/4 of GPU)
    memory_cap_bytes: int | None = Field(default=None, ge=1)
    protocol: TimingProtocol = TimingProtocol()
    comm_warmup_iters: int = Field(default=3, ge=0)
    comm_iters: int = Field(default=10, ge=1)
    #: with comm_layouts: fp32 sum all-reduces (a data-parallel table's gradient) and the row-wise collectives
    #: (runner.PROFILED_COLLECTIVES) of 4 KiB, 16 KiB, ... up to this many bytes over each device count the layouts
    #: span, in the layouts' process groups (0: none). 16 MiB: the 7 sizes take about a second on 4 gloo processes on
    #: 2 cores
    all_reduce_max_bytes: int = Field(default=16 * 2**20, ge=0)
    #: the first this many sampled shards timed again as data-parallel tables: TorchRec's dense kernel at the local
    #: batch ceil(batch_size / D) of each D in runner.DATA_PARALLEL_DEVICE_COUNTS (rows kind "data_parallel",
    #: num_devices D; `pretrain` fits the line that prices data-parallel kernels to them)
    data_parallel_shards: int = Field(default=0, ge=0)
    #: the first this many sampled shards timed again as row-wise tables: each table's first row block over each D in
    #: runner.ROW_WISE_DEVICE_COUNTS, the fused kernel at the batch (rows kind "compute", so the compute network
    #: learns the blocks it prices row-wise tables by)
    row_wise_shards: int = Field(default=0, ge=0)
    #: the first this many sampled shards timed again with their tables in host memory on fbgemm's UVM (CUDA only):
    #: every table cached, and the first half cached beside the rest in HBM, at each of `cache_load_factors`, then
    #: every table without a cache (`caching.caching_variants`; rows kind "compute", their `kernel` says which)
    caching_shards: int = Field(default=0, ge=0)
    cache_load_factors: tuple[float, ...] = Field(default=DEFAULT_CACHE_LOAD_FACTORS, min_length=1)
    max_devices: int | None = Field(default=None, ge=2)  # None: GPU count, or max(4, cores) on CPU
    #: stop starting whole shards after this many seconds of the run (None: measure them all), once
    #: `floor_shards` of them (each worker its share) are in the dataset; a rerun of the same settings measures what
    #: it left
    budget_s: float | None = Field(default=None, gt=0)
    floor_shards: int = Field(default=0, ge=0)
    chunk_size: int = Field(default=25, ge=1)  # rows per flush to disk
    #: this worker's slice of the run (shard configs and all-to-all layouts i with i % workers == worker): K
    #: workers with the same settings measure the run once between them, into one dataset
    worker: int = Field(default=0, ge=0)
    workers: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _worker_in_range(self) -> ProfileSettings:
        if any(not 0.0 < f <= 1.0 for f in self.cache_load_factors):
            raise ValueError(f"cache_load_factors {list(self.cache_load_factors)}: each is a share of a table's rows, "
                             "in (0, 1]")
        if self.worker >= self.workers:
            raise ValueError(f"worker {self.worker} is not one of 0..{self.workers - 1} (workers {self.workers})")
        return self
