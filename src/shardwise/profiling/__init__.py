"""Ground truth on real hardware: fused TBE kernel and all-to-all timings -> a Parquet cost dataset."""

from .comm import AllToAllSession, CommTiming, measure_all_to_all, measure_all_to_all_many
from .dataset import append_rows, load_costs, noise_floor
from .hardware import DeviceName, check_device_name, hardware_info, hardware_kind, resolve_device
from .kernel import ShardTiming, calibrate_reference, measure_shard, resolve_timing
from .protocol import CommPricing, MeasurementSettings, TimingProtocol
from .runner import ProfileSettings, ProfileSummary, profile
from .sampling import sample_comm_layouts, sample_shard_configs
from .schema import DATASET_FORMAT

__all__ = [
    "AllToAllSession",
    "CommPricing",
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
