"""Calls on a stack of their own. kfp's compiler calls `inspect.stack()` for every step it adds, and under
`python -m pytest` (make test) each call scans the whole of sys.modules for each of runpy's frames, whose file
`<frozen runpy>` is no module's: seconds a compile once the suite has imported torch, TorchRec and MLflow. A worker
thread's stack holds none of the suite's frames."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_thread(call: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`call(*args, **kwargs)` run in a worker thread, waited for; its result, or its exception raised here."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args, **kwargs).result()
