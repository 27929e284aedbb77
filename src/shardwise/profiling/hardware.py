"""Which hardware a measurement ran on: a slug that names cost models, and the details stored per row."""

from __future__ import annotations

import logging
import os
import platform
import re
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from shardwise.errors import ShardwiseError
from shardwise.extras import fbgemm_requirement, missing_fbgemm


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device` as a torch.device; None means CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(device)!r} is not supported: use 'cpu' or 'cuda[:N]'")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but CUDA is not available on this machine")
    return resolved


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@lru_cache(maxsize=1)
def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str | torch.device | None = None) -> str:
    """The human-readable device name: the GPU's name, or the CPU model."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return _cpu_model_name()


def hardware_kind(device: str | torch.device | None = None) -> str:
    """Slug naming the hardware a cost model is valid for, e.g. "cpu-x86_64-2c", "cuda-nvidia-h100-80gb-hbm3"."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return f"cuda-{_slug(torch.cuda.get_device_name(dev))}"
    return f"cpu-{platform.machine().lower()}-{os.cpu_count() or 1}c"


@lru_cache(maxsize=1)
def _cpu_last_level_cache_bytes() -> int:
    """Size of the CPU's largest cache (from sysfs; 32 MiB when it cannot be read)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        match = re.fullmatch(r"(\d+)([KMG]?)", text)
        if match:
            sizes.append(int(match[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match[2]])
    return max(sizes, default=32 * 2**20)


def last_level_cache_bytes(device: str | torch.device | None = None) -> int:
    """The device's last-level cache: a GPU's L2, a CPU's largest cache (as this machine reports it)."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 * 2**20))
    return _cpu_last_level_cache_bytes()


class KernelUnavailableError(ShardwiseError):
    """fbgemm's kernels cannot load on this machine (the wrong build for it)."""


def import_fbgemm() -> ModuleType:
    """fbgemm_gpu, or one error saying which build this machine needs (the image's CUDA build needs the NVIDIA
    driver's libraries, libnvidia-ml among them, which only a GPU node's container runtime provides)."""
    # a build that cannot load logs its loader error to the root logger before raising: the error below says it
    logging.disable(logging.ERROR)
    try:
        import fbgemm_gpu  # heavy (registers its operators with torch): only when kernels are built or recorded
    except (ImportError, OSError) as err:
        if isinstance(err, ModuleNotFoundError) and err.name == "fbgemm_gpu":  # not installed: which build to install
            raise missing_fbgemm(str(torch.__version__), torch.version.cuda is not None) from None
        cause = err.__cause__ or err
        raise KernelUnavailableError(
            f"fbgemm_gpu cannot load here ({str(cause).splitlines()[0][:160]}): its CUDA build needs an NVIDIA driver "
            "(a GPU node; in a container, the NVIDIA container runtime), CPU-only machines need "
            f"{fbgemm_requirement(str(torch.__version__), cuda=False)} (requirements/cpu.txt)"
        ) from None
    finally:
        logging.disable(logging.NOTSET)
    return fbgemm_gpu


def fbgemm_version() -> str:
    """The installed fbgemm_gpu version ("unknown" when it does not say)."""
    return str(getattr(import_fbgemm(), "__version__", "unknown"))


def hardware_info(device: str | torch.device | None = None) -> dict[str, Any]:
    """What every cost row records about where it was measured (schema.py's hardware columns)."""
    dev = resolve_device(device)
    return {
        "hardware_kind": hardware_kind(dev),
        "device_name": device_name(dev),
        "cpu_count": int(os.cpu_count() or 1),
        "num_threads": int(torch.get_num_threads()),
        "torch_version": str(torch.__version__),
        "fbgemm_version": fbgemm_version(),
    }
