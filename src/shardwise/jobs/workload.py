"""`shardwise workload synth|split|task` and `shardwise augment`: table populations, held-out splits, tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import Field

from shardwise.workload import (
    DIMS,
    Optimizer,
    WeightsPrecision,
    augment_tables,
    load_tables,
    sample_task,
    save_tables,
    save_task,
    shard_memory_bytes,
    split_tables,
    synthesize_tables,
    write_index_data,
)
from shardwise.workload.synthetic import DLRM_2021_BATCH_SIZE, DLRM_2021_NUM_TABLES

from .base import JobResult, JobSettings

GIB = 2**30


class SynthSettings(JobSettings):
    """Synthetic tables with the DLRM 2021 embedding dataset's statistics, and their index data."""

    num_tables: int = Field(default=DLRM_2021_NUM_TABLES, ge=1, description="tables to draw")
    row_scale: float = Field(default=1.0, gt=0, description="multiply rows (e.g. 0.01 to fit CPU memory)")
    batch_size: int = Field(default=DLRM_2021_BATCH_SIZE, ge=1,
                            description="batch the index data and the access skew are made for")
    seed: int = 0
    out: str = Field(description="directory: tables.json (shardwise.tables/v1) and indices.pt")
    gzip: bool = Field(default=False, description="gzip indices.pt (the reader detects it)")
    no_index_data: bool = Field(default=False, description="skip indices.pt (large at full scale)")


class SynthResult(JobResult):
    """The table file (and index data) written, with the population's statistics."""

    tables_path: str
    indices_path: str | None
    num_tables: int
    batch_size: int
    pooling_mean: float
    pooling_sd: float
    empty_share: float
    rows_mean: float
    rows_sd: float

    def summary(self) -> str:
        """The statistics the synthetic population was drawn to match."""
        line = (
            f"{self.tables_path}: {self.num_tables} tables, batch {self.batch_size}; pooling mean "
            f"{self.pooling_mean:.1f} sd {self.pooling_sd:.1f} ({self.empty_share:.1%} empty); rows mean "
            f"{self.rows_mean:,.0f} sd {self.rows_sd:,.0f}"
        )
        if self.indices_path:
            line += f"\n{self.indices_path}: index data (DLRM dataset format)"
        return line


def synth(settings: SynthSettings) -> SynthResult:
    """Draw the tables, write tables.json and (unless told not to) indices.pt."""
    tableset = synthesize_tables(
        settings.num_tables, settings.seed, row_scale=settings.row_scale, batch_size=settings.batch_size
    )
    out = Path(settings.out)
    tables_path = save_tables(tableset, out / "tables.json")
    indices = None if settings.no_index_data else write_index_data(tableset, out / "indices.pt", compress=settings.gzip)
    pooling = np.array([t.pooling_factor for t in tableset.tables])
    rows = np.array([t.rows for t in tableset.tables])
    return SynthResult(
        tables_path=str(tables_path), indices_path=None if indices is None else str(indices),
        num_tables=len(tableset.tables), batch_size=tableset.batch_size,
        pooling_mean=float(pooling.mean()), pooling_sd=float(pooling.std()), empty_share=float((pooling == 0).mean()),
        rows_mean=float(rows.mean()), rows_sd=float(rows.std()),
    )


class SplitSettings(JobSettings):
    """Split a table file into training and held-out tables by source table."""

    tables: str = Field(description="shardwise.tables/v1 file")
    holdout_fraction: float = Field(default=0.2, gt=0, lt=1, description="share of source tables held out")
    seed: int = 0
    out: str = Field(description="directory: train.json and holdout.json")


class SplitResult(JobResult):
    """The two table files written."""

    train_path: str
    holdout_path: str
    train_tables: int
    holdout_tables: int

    def summary(self) -> str:
        """One line per file."""
        return f"{self.train_path}: {self.train_tables} tables\n{self.holdout_path}: {self.holdout_tables} tables"


def split(settings: SplitSettings) -> SplitResult:
    """Tables that share index data (column halves, dim copies) stay on the same side."""
    train, holdout = split_tables(load_tables(settings.tables), settings.holdout_fraction, settings.seed)
    out = Path(settings.out)
    return SplitResult(
        train_path=str(save_tables(train, out / "train.json")),
        holdout_path=str(save_tables(holdout, out / "holdout.json")),
        train_tables=len(train.tables), holdout_tables=len(holdout.tables),
    )


class TaskSettings(JobSettings):
    """Sample a sharding task (shardwise.task/v1) from a table file."""

    tables: str = Field(description="shardwise.tables/v1 file")
    num_tables: int = Field(ge=1, description="tables in the task (drawn without replacement)")
    num_devices: int = Field(ge=1, description="devices to shard over")
    memory_slack: float = Field(default=1.5, gt=0, description="memory per device = slack x total memory / devices")
    device_memory_bytes: int | None = Field(default=None, ge=1, description="fixed memory per device instead")
    optimizer: Optimizer = "rowwise_adagrad"
    weights_precision: WeightsPrecision = "fp32"
    seed: int = 0
    out: str = Field(description="task JSON path")


class TaskResult(JobResult):
    """The task written and its memory."""

    path: str
    num_tables: int
    num_devices: int
    device_memory_bytes: int
    memory_bytes: int

    def summary(self) -> str:
        """One line: tables, devices, memory per device and in all."""
        return (
            f"{self.path}: {self.num_tables} tables on {self.num_devices} devices, "
            f"{self.device_memory_bytes / GIB:.3f} GiB each ({self.memory_bytes / GIB:.3f} GiB in all)"
        )


def task(settings: TaskSettings) -> TaskResult:
    """Draw the task's tables, size device memory, write the task file."""
    sampled = sample_task(
        load_tables(settings.tables), settings.num_tables, settings.num_devices, settings.seed,
        memory_slack=settings.memory_slack, device_memory_bytes=settings.device_memory_bytes,
        optimizer=settings.optimizer, weights_precision=settings.weights_precision,
    )
    return TaskResult(
        path=str(save_task(sampled, settings.out)),
        num_tables=len(sampled.tables),
        num_devices=sampled.num_devices,
        device_memory_bytes=sampled.device_memory_bytes,
        memory_bytes=shard_memory_bytes(sampled.tables, sampled.batch_size, sampled.optimizer,
                                        sampled.weights_precision),
    )


class AugmentSettings(JobSettings):
    """NeuroShard's augmentation: every table at every dim, column halves, pooling-resampled copies."""

    tables: str = Field(description="shardwise.tables/v1 file")
    seed: int = 0
    out: str = Field(description="augmented shardwise.tables/v1 file")
    dims: tuple[int, ...] = Field(default=tuple(DIMS), min_length=1, description="dims every table gets",
                                  json_schema_extra={"nargs": "+"})
    halvings: int = Field(default=1, ge=0, description="column halvings per table")
    pooling_resamples: int = Field(default=1, ge=0, description="pooling-resampled copies per table")


class AugmentResult(JobResult):
    """The augmented table file."""

    path: str
    num_tables: int
    source_tables: int

    def summary(self) -> str:
        """One line: how many tables from how many."""
        return f"{self.path}: {self.num_tables} tables from {self.source_tables}"


def augment(settings: AugmentSettings) -> AugmentResult:
    """Augment the table population (the cost model then sees more dims, widths and poolings)."""
    tableset = load_tables(settings.tables)
    augmented = augment_tables(
        tableset, settings.seed, dims=list(settings.dims), halvings=settings.halvings,
        pooling_resamples=settings.pooling_resamples,
    )
    return AugmentResult(
        path=str(save_tables(augmented, settings.out)),
        num_tables=len(augmented.tables), source_tables=len(tableset.tables),
    )
