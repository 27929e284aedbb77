"""The changes a refinement round can make, priced by the corrected model: moves and swaps of one shard off the
slowest device (`_candidates`), a round's chain of them (`plan_round`), and the table whose shard alone holds the
slowest device up, to be split (`holding_up`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from shardwise.search.plan import Shard
from shardwise.workload.tables import DIM_ALIGNMENT

from .refine_measure import Layout, Refiner


@dataclass(frozen=True)
class Change:
    """A move of one shard off a device (or a swap with another device's shard), priced by the corrected model."""

    description: str  #: "t3[0] 0->2" (a move) or "t3[0] 0->2, t7[0] 2->0" (a swap)
    move: str  #: the shard it takes off the device and where to: "t3[0] 0->2" for both
    devices: tuple[int, int]  #: the device it relieves, the device it loads
    shards: list[Shard]  #: both devices' shards after it
    compute_ms: tuple[float, float]  #: both devices' corrected predicted compute after it
    pair_ms: float  #: the larger of the two devices' corrected cost (compute + all-to-all) after it
    max_ms: float  #: the corrected slowest device of the whole plan after it


def _candidates(refiner: Refiner, layout: Layout, compute: Sequence[float], comm: np.ndarray,
                slowest: int, exclude: Collection[int] = ()) -> list[Change]:
    """Moves and swaps off the slowest device to any device but `exclude`, with their corrected predictions, best
    first (one cost-model call for all of them). `compute` is each device's compute, measured (or predicted, for a
    device changed earlier in the round); the model's prediction of a changed device is scaled by that device's
    residual, compute / predicted."""
    task = refiner.task
    devices = range(task.num_devices)
    predicted = refiner.predicted([layout.on(d) for d in devices])
    residual = [m / p if p > 0 else 1.0 for m, p in zip(compute, predicted, strict=True)]
    costs = np.array(compute) + comm
    options: list[tuple[str, str, int, list[Shard], list[Shard]]] = []  # change, move, device, both devices' shards
    source = layout.on(slowest)
    for other in devices:
        if other == slowest or other in exclude:
            continue
        target = layout.on(other)
        for s in source:
            rest = [x for x in source if x is not s]
            moved = s.model_copy(update={"device": other})
            move = f"{s.table}[{s.col_offset}] {slowest}->{other}"
            options.append((move, move, other, rest, [*target, moved]))
            for t in target:
                back = t.model_copy(update={"device": slowest})
                options.append((f"{move}, {t.table}[{t.col_offset}] {other}->{slowest}", move, other, [*rest, back],
                                [*[x for x in target if x is not t], moved]))
    options = [o for o in options if refiner.fits(o[3], slowest) and refiner.fits(o[4], o[2])]
    if not options:
        return []
    ms = refiner.predicted([group for o in options for group in (o[3], o[4])]).reshape(-1, 2)
    found = []
    for (change, move, other, a_shards, b_shards), (a_ms, b_ms) in zip(options, ms, strict=True):
        a_ms, b_ms = float(a_ms * residual[slowest]), float(b_ms * residual[other])
        new = costs.copy()
        new[slowest], new[other] = a_ms + comm[slowest], b_ms + comm[other]
        found.append(Change(change, move, (slowest, other), [*a_shards, *b_shards], (a_ms, b_ms),
                            float(max(new[slowest], new[other])), float(new.max())))
    found.sort(key=lambda c: (c.max_ms, c.pair_ms))
    return found


def plan_round(refiner: Refiner, layout: Layout, measured: Sequence[float], comm: np.ndarray,
               refused: set[str]) -> tuple[Layout, list[Change], float]:
    """One round's changes, on corrected predictions: relieve the slowest device, then the next slowest, ... while
    each change lowers the device it relieves without loading another to that level. Several devices within noise
    of the slowest are common (8 devices, a balanced start): a single move off one of them cannot lower the plan's
    slowest device, a move off each can. Each device changes at most once a round, so every prediction is
    corrected by a residual measured on that device as it was (chained changes would compound the model's error).
    Returns the changed layout, the changes and the predicted slowest device. `refused`: first changes of rounds
    the measurements refused, not proposed first again (with any partner)."""
    compute = list(measured)
    changes: list[Change] = []
    touched: set[int] = set()
    while True:
        costs = np.array(compute) + comm
        slowest = int(costs.argmax())
        if slowest in touched:  # relieved once this round and still the slowest: nothing more to gain now
            break
        options = [c for c in _candidates(refiner, layout, compute, comm, slowest, exclude=touched)
                   if c.pair_ms < costs[slowest] and not (not changes and c.move in refused)]
        if not options:
            break
        change = options[0]
        layout = Layout([s for s in layout.shards if s.device not in change.devices] + change.shards,
                        layout.data_parallel, layout.row_wise)
        (a, b), (a_ms, b_ms) = change.devices, change.compute_ms
        compute[a], compute[b] = a_ms, b_ms
        touched.update(change.devices)
        changes.append(change)
    return layout, changes, float(max(np.array(compute) + comm))


def holding_up(refiner: Refiner, layout: Layout, kernel_ms: Sequence[float], slowest: int) -> tuple[str, int] | None:
    """The table whose shard keeps device `slowest` above the mean, and the column slices to split it into: the
    device's costliest shard alone by the model, scaled by the device's residual (its `kernel_ms`, measured or
    predicted, over the model's prediction), where that is more than the devices' mean `kernel_ms` and the table
    has aligned slices of half its shard's width, no more of them than devices (None otherwise)."""
    task = refiner.task
    shards = layout.on(slowest)
    if not shards:
        return None
    predicted = refiner.predicted([shards, *([s] for s in shards)])
    residual = kernel_ms[slowest] / predicted[0] if predicted[0] > 0 else 1.0
    top = int(np.argmax(predicted[1:]))
    if predicted[1 + top] * residual <= float(np.mean(kernel_ms)):
        return None
    shard, dim = shards[top], task.table(shards[top].table).dim
    pieces = 2 * (dim // shard.dim)
    if pieces > task.num_devices or dim % pieces or (dim // pieces) % DIM_ALIGNMENT:
        return None
    return shard.table, pieces


def split_change(split: tuple[str, int]) -> str:
    """A split's change as a round records it: the table and its column slices."""
    return f"{split[0]} split into {split[1]} column slices, the other tables searched around them"
