"""`shardwise workload synth|from|split|task` and `shardwise augment`: table populations (synthetic, or the user's
own), held-out splits, tasks; and the pipeline's workload step (`build`): either population, split."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from shardwise.errors import ShardwiseError
from shardwise.workload import (
    DIMS,
    Optimizer,
    TableSetError,
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
from shardwise.workload.dlrm_datasets import MAX_INDEX_DATA_BYTES
from shardwise.workload.given import is_tables_document, read_given_tables
from shardwise.workload.synthetic import DLRM_2021_BATCH_SIZE, DLRM_2021_NUM_TABLES

from .base import JobResult, JobSettings, SettingsError

GIB = 2**30
#: the index data's name in a workload directory (the synthetic step's, or a DLRM dataset file's)
INDEX_DATA_NAME = "indices.pt"
#: an object fetched from the object store, while it is read (renamed to the index data, or removed)
FETCHED_NAME = "fetched.part"


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
    indices = None if settings.no_index_data else write_index_data(tableset, out / INDEX_DATA_NAME,
                                                                   compress=settings.gzip)
    pooling = np.array([t.pooling_factor for t in tableset.tables])
    rows = np.array([t.rows for t in tableset.tables])
    return SynthResult(
        tables_path=str(tables_path), indices_path=None if indices is None else str(indices),
        num_tables=len(tableset.tables), batch_size=tableset.batch_size,
        pooling_mean=float(pooling.mean()), pooling_sd=float(pooling.std()), empty_share=float((pooling == 0).mean()),
        rows_mean=float(rows.mean()), rows_sd=float(rows.std()),
    )


class GivenSettings(JobSettings):
    """The user's tables as the workload: a tables file, or a DLRM dataset file's tables and index data."""

    tables: str = Field(description="shardwise.tables/v1 file, or a DLRM dataset file (torch.save((indices, offsets, "
                        "lengths)), maybe gzip: rows = max index + 1, pooling and reuse from its index data, which is "
                        "kept for profiling); a path or s3://bucket/key")
    dims: tuple[int, ...] = Field(default=(), description="a DLRM dataset file's embedding dims (it has none): one "
                                  "for every table, or one per table (default: each drawn from 4, 8, ..., 128 with "
                                  "the seed)", json_schema_extra={"nargs": "+"})
    seed: int = 0
    out: str = Field(description="directory: tables.json (shardwise.tables/v1) and, from a DLRM dataset, indices.pt")


class GivenResult(JobResult):
    """The table file (and index data) written from the user's file, with the population's statistics."""

    tables_path: str
    indices_path: str | None
    source: str
    kind: Literal["tables file", "DLRM dataset"]
    num_tables: int
    batch_size: int
    pooling_mean: float
    rows_mean: float

    def summary(self) -> str:
        """Where the tables came from and what they are."""
        line = (
            f"{self.tables_path}: {self.num_tables} tables from the {self.kind} {self.source}, batch "
            f"{self.batch_size}; pooling mean {self.pooling_mean:.1f}, rows mean {self.rows_mean:,.0f}"
        )
        if self.indices_path:
            line += f"\n{self.indices_path}: index data (DLRM dataset format)"
        return line


def fetch_object(uri: str, dest: Path, *, what: str = "tables") -> Path:
    """The object at `uri` (s3://bucket/key) copied to `dest`; refused past the largest file the readers take
    (`what` names the file in the error: "tables", "production task")."""
    # pyarrow's S3 client and the object store's one-line errors, as the cost dataset reaches it: loaded for a URI only
    import pyarrow as pa
    from pyarrow import fs

    from shardwise.profiling.dataset import object_store, object_store_error

    bucket, _, key = uri.split("://", 1)[1].partition("/")
    if not uri.startswith("s3://") or not bucket or not key.strip("/"):
        raise TableSetError(f"{what} {uri!r}: an object in the object store is s3://bucket/key")
    store, path = object_store(uri)
    try:
        info = store.get_file_info(path)
        if info.type != fs.FileType.File:
            raise TableSetError(f"{uri}: no such object in the object store"
                                + (" (it is a prefix: name one file under it)" if info.type == fs.FileType.Directory
                                   else ""))
        if info.size > MAX_INDEX_DATA_BYTES:
            raise TableSetError(f"{uri}: {info.size} bytes, over the {MAX_INDEX_DATA_BYTES} a {what} file may "
                                "hold")
        dest.parent.mkdir(parents=True, exist_ok=True)
        # the bytes as stored: pyarrow would inflate a .gz name, past the reader's guard against gzip bombs
        with store.open_input_stream(path, compression=None) as src, dest.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    except (OSError, pa.ArrowException) as err:
        raise object_store_error(uri, err) from None
    return dest


def given(settings: GivenSettings) -> GivenResult:
    """Read the user's tables (fetched first from the object store), write tables.json and, for a DLRM dataset,
    its index data as indices.pt (table names t0, t1, ... match it, as `profile --indices` reads it)."""
    out = Path(settings.out)
    if "://" not in settings.tables:
        return _given_from(settings, Path(settings.tables), keep=True)
    fetched = fetch_object(settings.tables, out / FETCHED_NAME)
    try:
        return _given_from(settings, fetched, keep=False)
    except ShardwiseError as err:
        err.args = (str(err).replace(str(fetched), settings.tables),)  # name the URI, not the copy
        raise
    finally:
        fetched.unlink(missing_ok=True)  # kept only as the index data, by then renamed


def _given_from(settings: GivenSettings, local: Path, *, keep: bool) -> GivenResult:
    """`given`, on the file at `local`: the user's (`keep`), or a copy of their object, moved to the index data."""
    out = Path(settings.out)
    is_tables = is_tables_document(local)
    if is_tables and settings.dims:
        raise SettingsError(f"dims {list(settings.dims)}: {settings.tables} is a tables file, whose tables have "
                            "their dims; dims are for a DLRM dataset file")
    read = read_given_tables(local, dims=settings.dims, seed=settings.seed)
    tableset = read.tables
    sources = sorted({t.source or t.name for t in tableset.tables})
    if len(sources) < 2:
        raise TableSetError(f"{settings.tables}: field 'tables' holds {len(sources)} source table(s); the workload "
                            "needs at least 2, to train on some and hold out others")
    tables_path = save_tables(tableset.model_copy(update={"given": True}), out / "tables.json")
    indices: Path | None = None
    if read.index_data:  # the dataset file is the index data, in the format the profiler reads
        indices = out / INDEX_DATA_NAME
        if not keep:
            local.replace(indices)
        elif local.resolve() != indices.resolve():
            shutil.copyfile(local, indices)
    return GivenResult(
        tables_path=str(tables_path), indices_path=None if indices is None else str(indices),
        source=settings.tables, kind="tables file" if is_tables else "DLRM dataset",
        num_tables=len(tableset.tables), batch_size=tableset.batch_size,
        pooling_mean=float(np.mean([t.pooling_factor for t in tableset.tables])),
        rows_mean=float(np.mean([t.rows for t in tableset.tables])),
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
    cover_extremes: bool | None = Field(
        default=None, description="(default: where the tables are your own, the workload's --tables) also the "
        "heaviest tenth of the tables by pooling x (dim + 16) at the tables' "
        "largest pooling factor and dim, and at their fewest and most rows (for your own tables: the cost model "
        "then trains on the extremes a plan for them meets)")


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
        cover_extremes=tableset.given if settings.cover_extremes is None else settings.cover_extremes,
    )
    return AugmentResult(
        path=str(save_tables(augmented, settings.out)),
        num_tables=len(augmented.tables), source_tables=len(tableset.tables),
    )


_SYNTH = SynthSettings.model_fields  # the synthetic step's and the split's own defaults, shared rather than repeated
_SPLIT = SplitSettings.model_fields


class WorkloadSettings(JobSettings):
    """The pipeline's workload: the user's tables where given, else synthetic ones, split into training and
    held-out tables."""

    tables: str = Field(default="", description=f"{GivenSettings.model_fields['tables'].description}; '' = synthetic "
                        "tables (num_tables, row_scale, batch_size)")
    dims: tuple[int, ...] = Field(default=(), description=GivenSettings.model_fields["dims"].description,
                                  json_schema_extra={"nargs": "+"})
    num_tables: int = Field(default=_SYNTH["num_tables"].default, ge=1, description=_SYNTH["num_tables"].description)
    row_scale: float = Field(default=_SYNTH["row_scale"].default, gt=0, description=_SYNTH["row_scale"].description)
    batch_size: int = Field(default=_SYNTH["batch_size"].default, ge=1,
                            description=f"{_SYNTH['batch_size'].description} (given tables keep their file's)")
    holdout_fraction: float = Field(default=_SPLIT["holdout_fraction"].default, gt=0, lt=1,
                                    description=_SPLIT["holdout_fraction"].description)
    seed: int = 0
    out: str = Field(description="directory: tables.json, indices.pt (synthetic tables, or a DLRM dataset's) and "
                     "split/train.json, split/holdout.json")

    @model_validator(mode="after")
    def _dims_for_a_dataset(self) -> WorkloadSettings:
        if self.dims and not self.tables:
            raise ValueError(f"dims {list(self.dims)} are for a DLRM dataset file's tables; synthetic tables draw "
                             "theirs")
        return self


class WorkloadResult(JobResult):
    """The population written and its split."""

    population: SynthResult | GivenResult
    split: SplitResult

    def summary(self) -> str:
        """The population's lines, then the split's."""
        return f"{self.population.summary()}\n{self.split.summary()}"


def build(settings: WorkloadSettings) -> WorkloadResult:
    """The given tables (or synthetic ones), split by source table into train.json and holdout.json."""
    population: SynthResult | GivenResult
    if settings.tables:
        population = given(GivenSettings(tables=settings.tables, dims=settings.dims, seed=settings.seed,
                                         out=settings.out))
    else:
        population = synth(SynthSettings(num_tables=settings.num_tables, row_scale=settings.row_scale,
                                         batch_size=settings.batch_size, seed=settings.seed, out=settings.out))
    halves = split(SplitSettings(tables=population.tables_path, holdout_fraction=settings.holdout_fraction,
                                 seed=settings.seed, out=str(Path(settings.out) / "split")))
    return WorkloadResult(population=population, split=halves)
