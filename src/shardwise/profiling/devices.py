"""A settings field naming a device, checked without torch: the settings of every command are built (and its
`--help` shown) before anything is measured."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_DEVICE_NAME = re.compile(r"(cpu|cuda(:\d+)?)")


def check_device_name(device: str | None) -> str | None:
    """`device` when it names a device shardwise runs on (cpu, cuda, cuda:N); else a ValueError saying so."""
    if device is not None and not _DEVICE_NAME.fullmatch(device):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    return device


#: a settings field naming a device (None: CUDA when present), checked where it is read
DeviceName = Annotated[str | None, AfterValidator(check_device_name)]
