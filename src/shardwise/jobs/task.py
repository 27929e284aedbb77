"""`shardwise task check`: validate a sharding task file and summarise it (imports no torch: it answers fast)."""

from __future__ import annotations

from pydantic import Field

from shardwise.workload import TaskError, load_task, shard_memory_bytes, task_fits

from .base import JobResult, JobSettings

GIB = 2**30


class CheckSettings(JobSettings):
    """Which task file to check."""

    file: str = Field(description="path to a shardwise.task/v1 JSON file")


class CheckResult(JobResult):
    """A valid task's shape and memory need against its devices' capacity."""

    file: str
    num_tables: int
    num_devices: int
    batch_size: int
    memory_bytes: int
    capacity_bytes: int

    def summary(self) -> str:
        """One line: ok, tables, devices, batch, memory."""
        return (
            f"{self.file}: ok ({self.num_tables} tables, {self.num_devices} devices, batch {self.batch_size}, "
            f"memory {self.memory_bytes / GIB:.2f} GiB of {self.capacity_bytes / GIB:.2f} GiB)"
        )


def check(settings: CheckSettings) -> CheckResult:
    """Load and validate the task (TaskError names the bad field); refuse one no plan can fit; report its memory."""
    task = load_task(settings.file)
    misfit = task_fits(task)
    if misfit:
        raise TaskError(f"{settings.file}: {misfit}")
    return CheckResult(
        file=settings.file,
        num_tables=len(task.tables),
        num_devices=task.num_devices,
        batch_size=task.batch_size,
        memory_bytes=shard_memory_bytes(task.tables, task.batch_size, task.optimizer, task.weights_precision),
        capacity_bytes=task.num_devices * task.device_memory_bytes,
    )
