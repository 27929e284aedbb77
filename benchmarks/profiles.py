"""What the cost-model experiments share: a preset's workload split as its pipeline run splits it, and a
gpu_check.sh archive of profiles unpacked."""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def extracted(archive: Path) -> Iterator[Path]:
    """A gpu_check.sh archive of profiles (datasets.tar.gz: costs/, probe_costs/) unpacked in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp)


def split_workload(preset: Any) -> tuple[Any, Any]:
    """A preset's (PipelineParams') synthetic tables split into training and held-out ones, as its pipeline run
    splits them."""
    from shardwise.workload import split_tables, synthesize_tables

    tables = synthesize_tables(preset.num_tables, seed=preset.seed, row_scale=preset.row_scale,
                               batch_size=preset.batch_size, progress=False)
    return split_tables(tables, preset.holdout_fraction, seed=preset.seed)
