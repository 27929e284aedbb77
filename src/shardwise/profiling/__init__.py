"""Ground truth on real hardware: fused TBE kernel and all-to-all timings -> a Parquet cost dataset.

The dataset and the profiling run (pandas, pyarrow) load on first use of one of their names: planning needs
neither. So do the kernels, the all-to-alls and the hardware's details (torch): a command's settings and options
(MeasurementSettings, DeviceName, ProfileSettings in run_settings.py) are built without them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardwise.lazy import on_first_use

from .devices import DeviceName, check_device_name
from .protocol import CommPricing, MeasurementSettings, TimingProtocol
from .run_settings import ProfileSettings
from .schema import DATASET_FORMAT

if TYPE_CHECKING:
    from .comm import (
        AllToAllSession,
        CommTiming,
        measure_all_reduce,
        measure_all_to_all,
        measure_all_to_all_many,
    )
    from .dataset import append_rows, load_costs, noise_floor
    from .hardware import hardware_info, hardware_kind, resolve_device
    from .kernel import ComputeKernel, ShardTiming, calibrate_reference, measure_shard, resolve_timing
    from .runner import ProfileSummary, profile
    from .sampling import sample_comm_layouts, sample_shard_configs

#: the modules that load on first use of one of their names
__getattr__ = on_first_use(__name__, {
    "comm": ("AllToAllSession", "CommTiming", "measure_all_reduce", "measure_all_to_all", "measure_all_to_all_many"),
    "dataset": ("append_rows", "load_costs", "noise_floor"),
    "hardware": ("hardware_info", "hardware_kind", "resolve_device"),
    "kernel": ("ComputeKernel", "ShardTiming", "calibrate_reference", "measure_shard", "resolve_timing"),
    "runner": ("ProfileSummary", "profile"),
    "sampling": ("sample_comm_layouts", "sample_shard_configs"),
})

__all__ = [
    "AllToAllSession",
    "CommPricing",
    "ComputeKernel",
    "DATASET_FORMAT",
    "MeasurementSettings",
    "CommTiming",
    "ProfileSettings",
    "ProfileSummary",
    "ShardTiming",
    "TimingProtocol",
    "append_rows",
    "calibrate_reference",
    "hardware_info",
    "hardware_kind",
    "load_costs",
    "measure_all_reduce",
    "measure_all_to_all",
    "measure_all_to_all_many",
    "measure_shard",
    "noise_floor",
    "profile",
    "resolve_device",
    "DeviceName",
    "check_device_name",
    "resolve_timing",
    "sample_comm_layouts",
    "sample_shard_configs",
]
