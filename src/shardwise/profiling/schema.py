"""Columns of the cost dataset (Parquet), `shardwise.costs/v1`: one row per measured shard, per device
of a measured all-to-all, or per measured all-reduce (or reduce-scatter) size and device count. A dataset is a
directory of part files with these columns (`dataset.py`). Other tools read these files, and a dataset is a history
that runs add parts to: add columns, never rename or drop them; a part without a column holds null in it (read as
`COMPUTE_DEFAULTS` on a compute row), a null meaning the column does not apply to the row or was not measured."""

from __future__ import annotations

DATASET_FORMAT = "shardwise.costs/v1"

#: every row
COMMON_COLUMNS = (
    # "compute" (one shard's fused TBE kernel), "comm" (one device's share of an all-to-all) or "all_reduce" (an fp32
    # sum all-reduce of `size_bytes` over `num_devices`, a data-parallel table's gradient: its median ms in bwd_ms,
    # fwd_ms 0), or the row-wise tables' collectives of `size_bytes` on each device
    # over `num_devices`: "reduce_scatter" (their outputs, its median ms in fwd_ms), "all_gather" (their gradients,
    # in bwd_ms) and "all_to_all" (an even one, their ids, in fwd_ms), or "data_parallel" (a shard's dense kernel,
    # TorchRec's data-parallel one, at the local batch
    # ceil(batch_size / num_devices); the compute columns, optimizer "sgd")
    "kind",
    "config_id",  # stable hash of what was measured; with `repeat`, the resume key
    "repeat",  # 0 for the first measurement of a config, 1.. for repeats (the noise floor)
    "fwd_ms",
    "bwd_ms",
    "batch_size",
    "measured_at",  # unix seconds (machines drift: record when)
    "hardware_kind",  # slug used to name cost models, e.g. "cpu-x86_64-2c", "cuda-nvidia-h100"
    "device_name",
    "num_threads",
    "cpu_count",
    "torch_version",
    "fbgemm_version",
    "timing",  # JSON of the timing protocol (warm-up, iterations, reference normalisation)
    "reference_ms",  # the reference kernel's calibrated ms that normalised timings are scaled by
    "raw_fwd_ms",  # medians before reference normalisation (equal to fwd_ms/bwd_ms when it is off)
    "raw_bwd_ms",
)
#: kind == "compute" (and "data_parallel")
COMPUTE_COLUMNS = (
    "tables_json",  # JSON list of TableSpec dicts (+ "source": the table whose index data was used)
    "num_tables",
    "optimizer",
    "weights_precision",
)
#: what took the measurement: "profile" (sampled shards and layouts), "refine" (a plan's device shard, timed
#: while refining it) or "adapt" (a shard timed while adapting a plan); null: not recorded
PROVENANCE_COLUMNS = ("provenance",)
#: kind == "compute": the median host ms to launch forward + backward on CUDA (null on CPU; a device pays it once a
#: step: above the kernels' ms, the shard is launch-bound), and what timed the call (the CUDA timer, "held",
#: "queued", "graph" or "events", or the CPU clock, "thread" or "wall"; a CUDA row without one is refused for training)
TIMER_COLUMNS = ("launch_ms", "timer")
#: kind == "compute" (null read as `COMPUTE_DEFAULTS`): the shard's kernel, "fused" (every table in HBM),
#: "fused_uvm_caching" (tables in host memory behind a cache in HBM, beside any in HBM; which ones in `tables_json`)
#: or "fused_uvm" (tables in host memory, no cache); its cache's load factor (0: no cache) and, once warm, its hit
#: rate over the distinct ids of a cycle of batches (null without a cache)
KERNEL_COLUMNS = ("kernel", "cache_load_factor", "cache_hit_rate")
#: what a compute row's null kernel columns read as: every table in HBM, no cache (as a task's and a plan's kernels)
COMPUTE_DEFAULTS: dict[str, str | float] = {"kernel": "fused", "cache_load_factor": 0.0}
#: kind == "comm" (and the collectives, "all_reduce" ... "all_to_all": num_devices, backend; "data_parallel":
#: num_devices)
COMM_COLUMNS = (
    "num_devices",
    "device",  # which device's time this row holds
    "widths_json",  # JSON list: per-device pooled output width (sum of dims) for the whole layout
    "backend",  # "nccl" or "gloo"
)
#: the collectives' kinds: the fp32 bytes each device puts in (an all-gather: gets out) (null on other rows)
ALL_REDUCE_COLUMNS = ("size_bytes",)
