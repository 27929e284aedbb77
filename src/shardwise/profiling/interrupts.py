"""Signals while a profile run writes: SIGINT and SIGTERM held until a write that must not be cut has finished
(`interrupts_deferred`), and SIGTERM turned into KeyboardInterrupt so pending rows are flushed first."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextlib.contextmanager
def interrupts_deferred(note: str | None = None) -> Iterator[list[int]]:
    """Hold SIGINT and SIGTERM until the block ends, then raise KeyboardInterrupt: a write that must not be cut
    (the last flush of rows, a dataset's conversion) finishes first. Yields the list of signals held so far;
    `note` goes to stderr when the first one arrives. Only the main thread receives signals."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def _hold(signum: int, frame: object) -> None:
        if not caught and note:
            print(note, file=sys.stderr, flush=True)
        caught.append(signum)

    previous: dict[signal.Signals, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN:  # an ignored signal (a background job's SIGINT) stays ignored
            previous[signum] = signal.signal(signum, _hold)
    try:
        yield caught
    finally:
        for held, handler in previous.items():
            signal.signal(held, handler if handler is not None else signal.SIG_DFL)
    if caught:
        raise KeyboardInterrupt(f"signal {caught[0]}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn `kill` (SIGTERM) into KeyboardInterrupt so pending rows are flushed before exiting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

