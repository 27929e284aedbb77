"""Train / held-out splits of a cost dataset's samples: held-out source tables, shard sizes and row blocks, and
held-out all-to-all layouts, each split seeded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardwise.workload import TableSpec

from .evaluate import ComputeSamples
from .samples import CostDataError


def shard_sources(shard: Sequence[TableSpec]) -> set[str]:
    """The source tables a shard's tables were cut from (a table cut from none is its own source)."""
    return {t.source or t.name for t in shard}


def pick_heldout_sources(samples: ComputeSamples, fraction: float, seed: int) -> tuple[str, ...]:
    """Source tables to hold out: whole groups of tables that never share a shard with the rest if the data
    has them (a profile of held-out tables), else a random `fraction` of the sources."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for shard in samples.shards:
        srcs = sorted(shard_sources(shard))
        for s in srcs[1:]:
            parent[find(s)] = find(srcs[0])
        find(srcs[0])
    comp_shards: dict[str, int] = {}
    for shard in samples.shards:
        root = find(next(iter(shard_sources(shard))))
        comp_shards[root] = comp_shards.get(root, 0) + 1
    rng = np.random.default_rng(seed)
    target = fraction * len(samples)
    roots = sorted(comp_shards)
    chosen: set[str] = set()
    taken = 0
    for i in rng.permutation(len(roots)):
        root = roots[i]
        if taken + comp_shards[root] <= 1.5 * target and comp_shards[root] > 1:
            chosen.add(root)
            taken += comp_shards[root]
        if taken >= 0.5 * target:
            return tuple(sorted(s for s in parent if find(s) in chosen))
    sources = sorted(parent)
    k = max(1, round(fraction * len(sources)))
    return tuple(sorted(sources[i] for i in rng.choice(len(sources), size=k, replace=False)))


def _pick_size_holdout(samples: ComputeSamples, seed: int) -> tuple[int, ...]:
    sizes = sorted({len(s) for s in samples.shards})
    interior = [s for s in sizes if 1 < s < sizes[-1]]
    if len(sizes) < 4 or not interior:
        return ()
    return (int(np.random.default_rng(seed).choice(interior)),)


@dataclass(frozen=True)
class ComputeSplit:
    """A dataset's compute samples split: shards to train and validate on, and the held-out ones, each evaluated
    apart (shards of held-out tables alone, of held-out sizes, and held-out tables' row blocks)."""

    heldout_sources: tuple[str, ...]
    heldout_num_tables: tuple[int, ...]
    train: ComputeSamples
    val: ComputeSamples
    test: ComputeSamples
    size_test: ComputeSamples
    row_block_test: ComputeSamples
    #: what makes the held-out figures rough
    notes: tuple[str, ...]


def split_compute_samples(samples: ComputeSamples, seed: int, *, holdout_sources: tuple[str, ...] | None,
                          holdout_fraction: float, holdout_num_tables: tuple[int, ...] | None,
                          val_fraction: float) -> ComputeSplit:
    """`samples` split by source table (`holdout_sources`, None: picked, a `holdout_fraction` of them) and by
    shard size (`holdout_num_tables`, None: one interior size picked); a seeded `val_fraction` of the rest
    validates. Refuses a split that leaves fewer than 10 shards to train on."""
    notes: list[str] = []
    heldout = holdout_sources if holdout_sources is not None else pick_heldout_sources(samples, holdout_fraction, seed)
    held = set(heldout)
    srcs = [shard_sources(s) for s in samples.shards]
    test_idx = [i for i, s in enumerate(srcs) if s <= held]
    # held-out row blocks (a row-wise table's share of one device) are evaluated apart: the held-out tables' figure,
    # which the promotion gate compares, stays the whole shards' it always was
    blocks = {i for i in test_idx if any(t.is_row_block for t in samples.shards[i])}
    block_idx, test_idx = sorted(blocks), [i for i in test_idx if i not in blocks]
    pool_idx = [i for i, s in enumerate(srcs) if not s & held]
    sizes_out = holdout_num_tables if holdout_num_tables is not None else _pick_size_holdout(samples.subset(pool_idx), seed)
    size_idx = [i for i in pool_idx if len(samples.shards[i]) in sizes_out]
    fit_idx = np.asarray([i for i in pool_idx if len(samples.shards[i]) not in sizes_out])
    if len(fit_idx) < 10:
        raise CostDataError(f"only {len(fit_idx)} training shards after holding out tables {list(heldout)[:5]}...: profile more shards")
    if len(test_idx) < 20:
        notes.append(f"only {len(test_idx)} shards built purely from held-out tables: metrics are rough")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(fit_idx)
    n_val = max(1, round(val_fraction * len(perm)))
    val, train = samples.subset(perm[:n_val]), samples.subset(perm[n_val:])
    test, size_test, block_test = samples.subset(test_idx), samples.subset(size_idx), samples.subset(block_idx)
    return ComputeSplit(tuple(heldout), tuple(sizes_out), train, val, test, size_test, block_test, tuple(notes))


def split_comm_layouts(layout: np.ndarray, seed: int, holdout_fraction: float, val_fraction: float,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks of the all-to-all rows (by `layout` id) to train on, to validate on and held out, whole layouts each:
    a seeded `holdout_fraction` of the layouts held out where there are 5 or more, a `val_fraction` validated on
    (and trained on where no layout is left to train on)."""
    layouts = np.unique(layout)
    lperm = np.random.default_rng(seed).permutation(layouts)
    n_test = max(1, round(holdout_fraction * len(layouts))) if len(layouts) >= 5 else 0
    n_cval = max(1, round(val_fraction * len(layouts)))
    is_test = np.isin(layout, lperm[:n_test])
    is_val = np.isin(layout, lperm[n_test : n_test + n_cval])
    is_train = ~(is_test | is_val)
    if is_train.sum() == 0:
        is_train = ~is_test
    return is_train, is_val, is_test
