"""What a cost model has seen: the ranges of the table features, shard sizes and batch it was trained on, and
which tables of a task lie outside them and how far (its predictions there are extrapolations, 2-10x off on the
MLPerf DLRM-DCNv2 tables for a model profiled on smaller ones)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .features import accesses_per_row

#: the ranged table features: (attribute, what a message calls it), read off the transformed features
TABLE_RANGES: tuple[tuple[str, str], ...] = (
    ("rows", "rows"), ("dim", "dim"), ("pooling_factor", "pooling"),
    ("accesses_per_row", "skew (accesses per distinct row)"),
)
#: names listed per feature in the one-line message before "and N more"
NAMES_SHOWN = 4

Range = tuple[float, float]


def _table_values(transformed: np.ndarray) -> dict[str, np.ndarray]:
    """[T, 21] transformed table features -> each ranged feature's [T] values (dims and rows whole again after
    float32's log1p and back)."""
    whole = np.rint(np.expm1(transformed[:, :2].astype(np.float64)))
    return {"dim": whole[:, 0], "rows": whole[:, 1],
            "pooling_factor": np.expm1(transformed[:, 2]), "accesses_per_row": accesses_per_row(transformed)}


def _span(values: Sequence[float] | np.ndarray) -> Range:
    array = np.asarray(values, dtype=np.float64)
    return float(array.min()), float(array.max())


@dataclass(frozen=True)
class FeatureRanges:
    """The smallest and largest of each feature a cost model was trained on (stored in cost_model.json)."""

    rows: Range
    dim: Range
    pooling_factor: Range
    #: mean accesses per distinct row a batch touches (`features.accesses_per_row`): the access skew
    accesses_per_row: Range
    #: tables in one profiled shard (one fused kernel call)
    tables_per_shard: Range
    #: the one batch size the model was profiled at
    batch_size: int

    @classmethod
    def of_training(cls, transformed: np.ndarray, tables_per_shard: Sequence[int], batch_size: int) -> FeatureRanges:
        """The ranges of the training tables' transformed features [T, 21] and of the training shards' sizes."""
        values = _table_values(transformed)
        return cls(**{name: _span(values[name]) for name, _ in TABLE_RANGES},
                   tables_per_shard=_span(tables_per_shard), batch_size=int(batch_size))

    def union(self, other: FeatureRanges) -> FeatureRanges:
        """The ranges of both (a model fine-tuned on more tables has seen both); this one's batch size."""
        spans = {name: (min(getattr(self, name)[0], getattr(other, name)[0]),
                        max(getattr(self, name)[1], getattr(other, name)[1]))
                 for name, _ in (*TABLE_RANGES, ("tables_per_shard", ""))}
        return FeatureRanges(**spans, batch_size=self.batch_size)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: [low, high] per feature, and the batch size."""
        return {**{name: list(getattr(self, name)) for name, _ in (*TABLE_RANGES, ("tables_per_shard", ""))},
                "batch_size": self.batch_size}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FeatureRanges:
        """Inverse of `to_json`; ValueError naming the field that is not a [low, high] pair of finite numbers."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"field 'feature_ranges' must be an object of [low, high] pairs, got {doc!r}")
        spans: dict[str, Range] = {}
        for name, _ in (*TABLE_RANGES, ("tables_per_shard", "")):
            pair = doc.get(name)
            if (not isinstance(pair, list | tuple) or len(pair) != 2
                    or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                               for v in pair) or pair[0] > pair[1]):
                raise ValueError(f"field 'feature_ranges.{name}' must be [low, high] (finite, low <= high), got {pair!r}")
            spans[name] = (float(pair[0]), float(pair[1]))
        batch = doc.get("batch_size")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"field 'feature_ranges.batch_size' must be a positive integer, got {batch!r}")
        return cls(**spans, batch_size=batch)

    def outside(self, names: Sequence[str], transformed: np.ndarray, batch_size: int,
                tables_per_device: Sequence[int] = ()) -> list[str]:
        """What of a task lies outside these ranges, one phrase per feature and side, naming the tables and how
        far out the farthest is ("dim 128 is 2x the largest seen (64): t0, t1, t2, t3 and 22 more")."""
        found: list[str] = []
        values = _table_values(transformed)
        for name, what in TABLE_RANGES:
            low, high = getattr(self, name)
            column = values[name]
            # the farthest out first, so the tables named are the ones the model knows least
            above = [i for i in np.argsort(-column, kind="stable") if column[i] > high]
            below = [i for i in np.argsort(column, kind="stable") if column[i] < low]
            if above:
                far = float(column[above[0]])
                found.append(f"{what} {_num(far)} is {_times(far, high)} the largest seen ({_num(high)}): "
                             f"{_names([names[i] for i in above])}")
            if below:
                near = float(column[below[0]])
                found.append(f"{what} {_num(near)} is {_times(low, near)} under the smallest seen ({_num(low)}): "
                             f"{_names([names[i] for i in below])}")
        most = self.tables_per_shard[1]
        crowded = [d for d, count in enumerate(tables_per_device) if count > most]
        if crowded:
            device = max(crowded, key=lambda d: tables_per_device[d])
            found.append(f"{tables_per_device[device]} shards on device {device} is "
                         f"{_times(tables_per_device[device], most)} the most in a profiled shard ({most:.0f}), on "
                         f"{len(crowded)} device(s)")
        if batch_size != self.batch_size:
            found.append(f"batch {batch_size} is not the profiled batch {self.batch_size} (predicted ms are at "
                         f"{self.batch_size})")
        return found


def _times(big: float, small: float) -> str:
    """How many times `small` goes into `big`, as a message says it ("2x", "1.3x", "over 1000x")."""
    if small <= 0:
        return "infinitely"
    ratio = big / small
    return "over 1000x" if ratio > 1000 else f"{ratio:.2g}x" if ratio < 10 else f"{ratio:.0f}x"


def _num(value: float) -> str:
    """A feature's value as a message says it: 40,000,000 rows, pooling 2.5."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown if len(names) <= NAMES_SHOWN else f"{shown} and {len(names) - NAMES_SHOWN} more"


def outside_line(found: Sequence[str]) -> str | None:
    """The one line a plan's notes and stats show for `FeatureRanges.outside`'s phrases (None: all inside)."""
    if not found:
        return None
    return f"outside what the cost model was trained on, its predictions are extrapolated: {'; '.join(found)}"
