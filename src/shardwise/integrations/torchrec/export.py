"""A TorchRec model's embedding tables as shardwise's table population (`shardwise.tables/v1`): the tables the cost
model learns from (`shardwise workload from --tables`, the pipeline's `workload_tables`).

    save_tables(export_tables(model, constraints, batch_size=65536), "tables.json")

Every EmbeddingBagCollection and EmbeddingCollection in the module (`named_modules()`) gives its tables: rows
(`num_embeddings`), dim (`embedding_dim`), and lookups per sample as TorchRec's planner counts them: the sum of the
table's `ParameterConstraints.pooling_factors` (one per feature it serves), else TorchRec's default of 1.0. A
table is named as in the collection, or by its collection's path and name where two collections share a name (as
the drop-in planner names it). Access skew: `zipf_alpha` where given, else none (profiling then samples rows
uniformly); a measured skew comes with index data (a DLRM dataset file) instead.

The production task's export (a model's tables with the devices and memory it trains on) belongs beside this one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import ValidationError
from torchrec.distributed.planner.constants import POOLING_FACTOR
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import BaseEmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from shardwise.workload import TableSet, TableSetError, TableSpec
from shardwise.workload.documents import describe_validation_error


def embedding_configs(module: torch.nn.Module) -> list[tuple[str, BaseEmbeddingConfig]]:
    """(collection path, table config) for every table of every embedding collection in `module`, in module order."""
    found: list[tuple[str, BaseEmbeddingConfig]] = []
    for path, child in module.named_modules():
        if isinstance(child, EmbeddingBagCollection):
            found += [(path, config) for config in child.embedding_bag_configs()]
        elif isinstance(child, EmbeddingCollection):
            found += [(path, config) for config in child.embedding_configs()]
    return found


def export_tables(
    module: torch.nn.Module,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    *,
    batch_size: int,
    zipf_alpha: float | Mapping[str, float] | None = None,
) -> TableSet:
    """The tables of `module`'s embedding collections at the global `batch_size` (see the module's text)."""
    found = embedding_configs(module)
    if not found:
        raise TableSetError(f"{type(module).__name__}: holds no EmbeddingBagCollection or EmbeddingCollection; "
                            "no tables to export")
    names = [config.name for _, config in found]
    unknown = sorted(set(constraints or {}) - set(names))
    if unknown:
        raise TableSetError(f"constraints name table(s) {unknown[:5]} that {type(module).__name__} does not hold; "
                            f"its tables: {sorted(set(names))[:10]}")
    tables: list[TableSpec] = []
    for path, config in found:
        key = config.name if names.count(config.name) == 1 or not path else f"{path}.{config.name}"
        constraint = (constraints or {}).get(config.name)
        pooling = sum(constraint.pooling_factors) if constraint and constraint.pooling_factors else POOLING_FACTOR
        try:
            tables.append(TableSpec.model_validate({"name": key, "rows": config.num_embeddings,
                                                    "dim": config.embedding_dim, "pooling_factor": float(pooling),
                                                    "zipf_alpha": skew_of(zipf_alpha, config.name)}))
        except ValidationError as err:
            raise TableSetError(f"table {key!r}: {describe_validation_error(err)}") from None
    try:
        return TableSet(batch_size=batch_size, tables=tuple(tables))
    except ValidationError as err:
        raise TableSetError(f"{type(module).__name__}'s tables: {describe_validation_error(err)}") from None


def skew_of(zipf_alpha: float | Mapping[str, float] | None, table: str) -> float | None:
    """A table's Zipf exponent: one for every table, or each table's by name (None where not given)."""
    return zipf_alpha.get(table) if isinstance(zipf_alpha, Mapping) else zipf_alpha
