"""A local run's console: the steps' output goes to a log file, the terminal gets one progress line per step."""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

#: a terminal colour code, as coloured log lines carry them
ANSI_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
#: kfp.local's lines when a task starts and ends
_TASK_EVENT = re.compile(r"(?:Executing task '([\w-]+)'|Task '([\w-]+)' finished with status (\w+))")
_TAIL_LINES = 40


class StepConsole:
    """Reads everything the run writes to fd 1 and 2 (this process and the steps' subprocesses) into the log file
    (and each step's lines into logs/<step>.log); the terminal gets one line per step with its time, and on
    failure the last lines of the log. The log file keeps every run, each after a line with its start time; a step's
    file holds that step's latest run."""

    def __init__(self, log_path: Path, terminal: IO[str]) -> None:
        self.log_path, self.terminal = log_path, terminal
        self.step_logs = log_path.with_name("logs")  # one file per step beside the whole run's log
        self.step: str | None = None
        self.started: dict[str, float] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)

    def pump(self, read_fd: int) -> None:
        """Copy the pipe to the log until every writer has closed it, reporting task events."""
        pending = ""
        with open(read_fd, "rb", closefd=True) as pipe, self.log_path.open("ab") as log:
            log.write(f"=== pipeline run started {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M:%S %z}\n".encode())
            while chunk := pipe.read1(65536):
                log.write(chunk)
                log.flush()
                pending += chunk.decode(errors="replace")
                *lines, pending = re.split(r"[\r\n]", pending)
                for line in lines:
                    self.line(ANSI_COLOURS.sub("", line))

    def line(self, line: str) -> None:
        """One line of output: remembered for a failure report; a task event becomes a progress line."""
        if line.strip():
            self.tail.append(line)
        event = _TASK_EVENT.search(line)
        if self.step is not None:
            with (self.step_logs / f"{self.step}.log").open("a") as log:
                log.write(line + "\n")
        if not event:
            return
        started, finished, status = event.groups()
        self.step = started
        if started:
            self.step_logs.mkdir(parents=True, exist_ok=True)
            # a step's first start in this run begins its file afresh; a loop's step starts again and appends
            with (self.step_logs / f"{started}.log").open("a" if started in self.started else "w") as log:
                log.write(line + "\n")
            self.started[started] = time.monotonic()
            if self.terminal.isatty():  # a live line, completed in place when the step ends
                self.terminal.write(f"{started:<22} running")
                self.terminal.flush()
            return
        elapsed_s = time.monotonic() - self.started.get(finished, time.monotonic())
        self.terminal.write(f"\r{finished:<22} {status.lower():<8} {elapsed_s:7.1f} s\n")
        if status != "SUCCESS":
            self.terminal.write("\n".join([f"--- last lines of {self.log_path}:", *self.tail, ""]))
        self.terminal.flush()


@contextlib.contextmanager
def console_to_log(log_path: Path) -> Iterator[None]:
    """Send fd 1 and 2 to `log_path` (the steps inherit them), with a progress line per step on the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    terminal = open(saved_out, "w", buffering=1, closefd=False)  # noqa: SIM115 - closed below
    console = StepConsole(log_path, terminal)
    reader = threading.Thread(target=console.pump, args=(read_fd,), daemon=True)
    reader.start()
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)  # drops the pipe's last write ends: the reader sees the end
        os.dup2(saved_err, 2)
        reader.join(timeout=60)
        terminal.close()
        os.close(saved_out)
        os.close(saved_err)
