"""`NeuralCostModel`: the pre-trained compute and communication networks behind the `CostModel` protocol,
with fast batched prediction and a plain on-disk format (weights state_dict + JSON, no pickled modules)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardwise.errors import ShardwiseError
from shardwise.workload import NUM_FEATURES, TableSpec

from .caching import UVM_KERNELS, KernelLine
from .coverage import FeatureRanges, outside_line
from .data_parallel import RING_VOLUME, AllReduceCost, DataParallelKernelCost
from .features import (
    COMM_FEATURE_NAMES,
    NUM_COMM_FEATURES,
    NUM_WORK_CHANNELS,
    TABLE_FEATURE_NAMES,
    FeatureNormaliser,
    TableFeatureCache,
    comm_features,
    comm_features_after,
    network_inputs,
)
from .networks import CommNet, ComputeNet, load_checked_state, zero_subnormal_weights

#: five work channels fed to the per-table MLP, and the ranges of the training features (`meta.feature_ranges`), so
#: planning says where a task lies outside them
MODEL_FORMAT = "shardwise.costmodel/v3"
CONFIG_FILE = "cost_model.json"
WEIGHTS_FILE = "weights.pt"
#: smallest cost the log targets represent (an all-to-all of nothing still takes a few microseconds)
MIN_MS = 1e-4
#: largest log-cost a prediction may have: exp() of an extrapolated log target overflows float32 (inf) for tables
#: far outside the training range (10^8 rows x 512 columns on a model profiled on CPU-sized tables); 10^9 ms is
#: already absurd, and finite sums keep search and policy training working (record `memory_property`)
MAX_LOG_MS = math.log(1e9)

#: the measured collectives' lines a model stores beside its networks (cost_model.json keys)
COLLECTIVE_LINES = tuple(RING_VOLUME)


class ModelFileError(ShardwiseError, ValueError):
    """A saved cost model that is missing, from another version, or damaged (names the file and the field)."""


@dataclass(frozen=True)
class NetworkConfig:
    """Sizes of the two networks."""

    hidden: int = 64
    layers: int = 2
    head_layers: int = 2
    comm_hidden: int = 32
    comm_layers: int = 2


@dataclass(frozen=True)
class ModelMeta:
    """What the model was trained for: hardware, batch size, timing reference, and log-target offsets."""

    hardware_kind: str
    batch_size: int
    #: the features the model was trained on, so planning says where a task lies outside them
    feature_ranges: FeatureRanges
    reference_ms: float | None = None
    compute_log_offset: tuple[float, float] = (0.0, 0.0)
    comm_log_offset: tuple[float, float] = (0.0, 0.0)
    info: dict[str, Any] = field(default_factory=dict)  # training provenance (seed, sizes, versions)


class NeuralCostModel:
    """Learned cost model for one hardware kind and batch size (implements `CostModel`)."""

    def __init__(
        self,
        compute_net: ComputeNet,
        normaliser: FeatureNormaliser,
        meta: ModelMeta,
        config: NetworkConfig,
        comm_net: CommNet | None = None,
        comm_normaliser: FeatureNormaliser | None = None,
    ) -> None:
        if (comm_net is None) != (comm_normaliser is None):
            raise ValueError("comm_net and comm_normaliser come together (both or neither)")
        self.compute_net = compute_net.eval()
        self.comm_net = comm_net.eval() if comm_net is not None else None
        for net in (self.compute_net, self.comm_net):
            if net is not None:
                zero_subnormal_weights(net)  # slow on many CPUs, and worth nothing
        self.normaliser = normaliser
        self.comm_normaliser = comm_normaliser
        self.meta = meta
        self.config = config
        self.hardware_kind = meta.hardware_kind
        self.batch_size = meta.batch_size
        self.reference_ms = meta.reference_ms
        self.device = torch.device("cpu")
        self._features = TableFeatureCache(meta.batch_size)
        # normalised feature rows of every table seen, found by object identity first (hashing a pydantic
        # TableSpec costs microseconds; search passes the same objects again and again), then by value
        self._row_by_id: dict[int, tuple[TableSpec, int]] = {}
        self._row_by_value: dict[TableSpec, int] = {}
        self._rows: list[np.ndarray] = []
        self._matrix = np.zeros((0, NUM_FEATURES + NUM_WORK_CHANNELS), dtype=np.float32)
        #: the measured all-reduce line that prices data-parallel tables' gradients (None: they are not searched)
        self.all_reduce: AllReduceCost | None = None
        #: the measured reduce-scatter line that prices row-wise tables' outputs (None: they are not searched), and
        #: the all-gather and all-to-all lines of their gradients and ids (None: the reduce-scatter's prices them)
        self.reduce_scatter: AllReduceCost | None = None
        self.all_gather: AllReduceCost | None = None
        self.all_to_all: AllReduceCost | None = None
        #: the line fitted to measured dense kernels that prices data-parallel tables' kernel on the local batch
        #: (None: profiled without them, the compute network prices it, `data_parallel.local_batch_table`)
        self.data_parallel_kernel: DataParallelKernelCost | None = None
        #: per UVM kernel, the line fitted to its profiled shards that prices tables in host memory beside the
        #: network's HBM price (`caching.HostMemoryCostModel`; empty: profiled without them, none leave HBM)
        self.uvm_kernels: dict[str, KernelLine] = {}
        self._compute_offset = torch.tensor(meta.compute_log_offset, dtype=torch.float32)
        self._comm_offset = torch.tensor(meta.comm_log_offset, dtype=torch.float32)

    @property
    def compute_kernels(self) -> tuple[str, ...]:
        """The kernels this model prices: "fused", and the UVM kernels it has measured lines of."""
        return ("fused", *[k for k in UVM_KERNELS if k in self.uvm_kernels])

    def to(self, device: str | torch.device) -> NeuralCostModel:
        """Move the networks to `device` (prediction inputs and outputs stay numpy)."""
        self.device = torch.device(device)
        self.compute_net.to(self.device)
        if self.comm_net is not None:
            self.comm_net.to(self.device)
        self._compute_offset = self._compute_offset.to(self.device)
        self._comm_offset = self._comm_offset.to(self.device)
        return self

    @property
    def has_comm(self) -> bool:
        """Whether the model was trained on all-to-all measurements."""
        return self.comm_net is not None

    # -- compute ---------------------------------------------------------------------------------------
    def normalised_features(self, tables: Sequence[TableSpec]) -> np.ndarray:
        """[T, 21 + 3] network inputs: normalised features and work channels (cached per TableSpec)."""
        ids = self._row_ids(tables)  # registers new tables before the matrix is built
        return self._feature_matrix()[ids]

    def _row_ids(self, tables: Sequence[TableSpec]) -> np.ndarray:
        out = np.empty(len(tables), dtype=np.int64)
        by_id, by_value = self._row_by_id, self._row_by_value
        for i, table in enumerate(tables):
            hit = by_id.get(id(table))
            if hit is not None and hit[0] is table:
                out[i] = hit[1]
                continue
            row = by_value.get(table)
            if row is None:
                row = by_value[table] = len(self._rows)
                self._rows.append(network_inputs(self._features([table]), self.normaliser)[0])
            by_id[id(table)] = (table, row)  # holding the table keeps its id from being reused
            out[i] = row
        return out

    def _feature_matrix(self) -> np.ndarray:
        if len(self._matrix) != len(self._rows):
            self._matrix = np.stack(self._rows) if self._rows else self._matrix[:0]
        return self._matrix

    @torch.inference_mode()
    def table_embeddings(self, tables: Sequence[TableSpec]) -> np.ndarray:
        """Per-table representations [T, H]; a shard's representation is the sum over its tables."""
        x = torch.from_numpy(self.normalised_features(tables)).to(self.device)
        return self.compute_net.embed(x).cpu().numpy()

    @torch.inference_mode()
    def compute_from_embeddings(self, summed: np.ndarray) -> np.ndarray:
        """[N, H] summed shard representations -> [N, 2] forward and backward ms (0 for no tables)."""
        s = torch.as_tensor(np.asarray(summed, dtype=np.float32), device=self.device)
        if s.ndim != 2 or s.shape[1] != self.compute_net.embedding_dim:
            raise ValueError(f"summed embeddings must be [N, {self.compute_net.embedding_dim}], got {tuple(s.shape)}")
        return self._ms_from_summed(s).cpu().numpy()

    def _ms_from_summed(self, summed: torch.Tensor) -> torch.Tensor:
        ms = torch.exp((self.compute_net.head_log_ms(summed) + self._compute_offset).clamp(max=MAX_LOG_MS))
        empty = summed[:, -1:] < 0.5  # the count channel: a device with no tables computes nothing
        return ms.masked_fill_(empty, 0.0)

    @torch.inference_mode()
    def predict_compute(self, shards: Sequence[Sequence[TableSpec]]) -> np.ndarray:
        """[N, 2] forward and backward ms of N shards (an empty shard costs 0), in one batched pass."""
        flat = [table for shard in shards for table in shard]
        counts = np.fromiter((len(shard) for shard in shards), dtype=np.int64, count=len(shards))
        # the per-table MLP runs once per distinct table, then embeddings are gathered and summed per shard
        unique, inverse = np.unique(self._row_ids(flat), return_inverse=True)
        x = torch.from_numpy(self._feature_matrix()[unique]).to(self.device)
        index = torch.from_numpy(np.repeat(np.arange(len(shards)), counts)).to(self.device)
        emb = self.compute_net.embed(x)[torch.from_numpy(inverse.reshape(-1)).to(self.device)]
        summed = torch.zeros(len(shards), emb.shape[1], dtype=emb.dtype, device=self.device)
        summed.index_add_(0, index, emb)
        return self._ms_from_summed(summed).cpu().numpy().astype(np.float64)

    # -- communication -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def predict_comm(self, widths: np.ndarray, compute_ms: np.ndarray) -> np.ndarray:
        """[N, D] per-device output widths and compute ms of N layouts -> [N, D, 2] fwd/bwd all-to-all ms."""
        self._check_comm()
        return self._comm_ms(comm_features(widths, compute_ms))

    @torch.inference_mode()
    def predict_comm_after(self, widths: np.ndarray, compute_ms: np.ndarray, devices: np.ndarray,
                           added_width: np.ndarray, new_compute_ms: np.ndarray,
                           layout_of: np.ndarray | None = None) -> np.ndarray:
        """[N, K, 2] fwd/bwd all-to-all ms of device `devices[n, j]` of layout n ([N, D] `widths`, `compute_ms`)
        once it takes `added_width[n]` more columns and computes for `new_compute_ms[n, j]`: `predict_comm`'s row
        for that device in that changed layout, with the network run on N x K rows instead of N x K x D. With
        `layout_of` ([N]), row n's layout is row `layout_of[n]` of [L, D] `widths` and `compute_ms`."""
        self._check_comm()
        return self._comm_ms(comm_features_after(widths, compute_ms, devices, added_width, new_compute_ms, layout_of))

    def _check_comm(self) -> None:
        if self.comm_net is None or self.comm_normaliser is None:
            raise ValueError(
                f"cost model for {self.hardware_kind!r} has no communication network: "
                "it was trained on a dataset without kind='comm' rows (profile with --comm-layouts)"
            )

    def _comm_ms(self, features: np.ndarray) -> np.ndarray:
        assert self.comm_net is not None and self.comm_normaliser is not None  # checked by the callers
        out = self.comm_net(torch.from_numpy(self.comm_normaliser(features)).to(self.device)) + self._comm_offset
        return torch.exp(out.clamp(max=MAX_LOG_MS)).cpu().numpy().astype(np.float64)

    # -- what it has seen -------------------------------------------------------------------------------------
    def outside_training(self, tables: Sequence[TableSpec], batch_size: int,
                         tables_per_device: Sequence[int] = ()) -> str | None:
        """One line naming the tables (and devices, and the batch) outside the ranges the model was trained on and
        how far out they are; None when all lie inside."""
        if not tables:
            return None
        return outside_line(self.meta.feature_ranges.outside([t.name for t in tables], self._features(tables), batch_size,
                                           tables_per_device))

    # -- persistence -------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write `cost_model.json` (config, normalisers, metadata) and `weights.pt` (tensors only)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": MODEL_FORMAT,
            "network": asdict(self.config),
            "meta": {**asdict(self.meta), "compute_log_offset": list(self.meta.compute_log_offset),
                     "comm_log_offset": list(self.meta.comm_log_offset),
                     "feature_ranges": self.meta.feature_ranges.to_json()},
            "normaliser": self.normaliser.to_json(),
            "comm_normaliser": self.comm_normaliser.to_json() if self.comm_normaliser else None,
            **{c: line.to_json() if (line := getattr(self, c)) else None for c in COLLECTIVE_LINES},
            "data_parallel_kernel": self.data_parallel_kernel.to_json() if self.data_parallel_kernel else None,
            "uvm_kernels": {k: line.to_json() for k, line in self.uvm_kernels.items()} or None,
        }
        (directory / CONFIG_FILE).write_text(json.dumps(doc, indent=1))
        tensors = {f"compute.{k}": v.detach().cpu() for k, v in self.compute_net.state_dict().items()}
        if self.comm_net is not None:
            tensors |= {f"comm.{k}": v.detach().cpu() for k, v in self.comm_net.state_dict().items()}
        torch.save(tensors, directory / WEIGHTS_FILE)
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> NeuralCostModel:
        """Read a model written by `save` (weights loaded with `weights_only=True`), checking every field, every
        tensor's shape and that weights and normalisers are finite: a damaged model never plans."""
        directory = Path(directory)
        config_path = directory / CONFIG_FILE
        if not config_path.is_file():
            raise ModelFileError(f"{directory}: no {CONFIG_FILE} (not a saved shardwise cost model)")
        try:
            doc = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
            raise ModelFileError(f"{config_path}: not a JSON cost-model config ({_first_line(err)})") from None
        if isinstance(doc, dict) and doc.get("format") == "shardwise.costmodel/v2":
            raise ModelFileError(f"{config_path}: a shardwise.costmodel/v2 model, made by an older shardwise: "
                                 "pretrain again (`shardwise pretrain`)")
        if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ModelFileError(
                f"{config_path}: field 'format' must be {MODEL_FORMAT!r}, got {found!r} "
                "(a model from another shardwise version: retrain it with `shardwise pretrain`)"
            )
        with _fields_of(config_path):
            config = NetworkConfig(**{k: _positive_int(k, v) for k, v in doc["network"].items()})
            meta_doc: Mapping[str, Any] = doc["meta"]
            meta = ModelMeta(
                hardware_kind=str(meta_doc["hardware_kind"]),
                batch_size=_positive_int("meta.batch_size", meta_doc["batch_size"]),
                reference_ms=None if meta_doc.get("reference_ms") is None
                else _finite("meta.reference_ms", meta_doc["reference_ms"]),
                compute_log_offset=_pair("meta.compute_log_offset", meta_doc["compute_log_offset"]),
                comm_log_offset=_pair("meta.comm_log_offset", meta_doc["comm_log_offset"]),
                info=dict(meta_doc.get("info") or {}),
                feature_ranges=FeatureRanges.from_json(meta_doc["feature_ranges"]),
            )
            normaliser = _normaliser("normaliser", doc["normaliser"], TABLE_FEATURE_NAMES)
            comm_norm = (_normaliser("comm_normaliser", doc["comm_normaliser"], COMM_FEATURE_NAMES)
                         if doc.get("comm_normaliser") else None)
            # optional (a model saved without an all-reduce prices no data-parallel tables, one without a
            # reduce-scatter no row-wise tables)
            lines = {c: AllReduceCost.from_json(doc[c]) if doc.get(c) else None for c in COLLECTIVE_LINES}
            dense = (DataParallelKernelCost.from_json(doc["data_parallel_kernel"])
                     if doc.get("data_parallel_kernel") else None)
            uvm = {str(k): KernelLine.from_json(line) for k, line in (doc.get("uvm_kernels") or {}).items()
                   if k in UVM_KERNELS}
        weights_path = directory / WEIGHTS_FILE
        try:
            tensors = torch.load(weights_path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError... for a bad file
            raise ModelFileError(f"{weights_path}: cannot read the weights ({_first_line(err)})") from None
        if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
            raise ModelFileError(f"{weights_path}: expected a dict of tensors as written by `save`")
        compute_net = ComputeNet(NUM_FEATURES, config.hidden, config.layers, config.head_layers, NUM_WORK_CHANNELS)
        comm_net = None
        if comm_norm is not None:
            comm_net = CommNet(NUM_COMM_FEATURES, config.comm_hidden, config.comm_layers)
        try:
            load_checked_state(compute_net, tensors, "compute.")
            if comm_net is not None:
                load_checked_state(comm_net, tensors, "comm.")
        except ValueError as err:
            raise ModelFileError(f"{weights_path}: {err}") from None
        model = cls(compute_net, normaliser, meta, config, comm_net, comm_norm)
        for collective, line in lines.items():
            setattr(model, collective, line)
        model.data_parallel_kernel = dense
        model.uvm_kernels = uvm
        return model.to(device)


@contextmanager
def _fields_of(path: Path) -> Iterator[None]:
    """Turn a missing or mistyped config field into a ModelFileError naming `path` and the field."""
    try:
        yield
    except KeyError as err:
        raise ModelFileError(f"{path}: missing field {err.args[0]!r} (retrain with `shardwise pretrain`)") from None
    except (TypeError, ValueError, AttributeError, IndexError) as err:
        raise ModelFileError(f"{path}: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    """The first sentence of an error's message (torch's run on for lines)."""
    text = str(err).strip().splitlines()
    return text[0].split(". ")[0][:200] if text else type(err).__name__


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelFileError(f"field {name!r} must be a positive integer, got {value!r}")
    return value


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelFileError(f"field {name!r} must be a finite number, got {value!r}")
    return float(value)


def _pair(name: str, values: Any) -> tuple[float, float]:
    if not isinstance(values, list | tuple) or len(values) != 2:
        raise ModelFileError(f"field {name!r} must be a list of 2 numbers, got {values!r}")
    return _finite(name, values[0]), _finite(name, values[1])


def _normaliser(name: str, doc: Any, expected: Sequence[str]) -> FeatureNormaliser:
    """A normaliser over exactly the features this version computes, with finite means and spreads."""
    if not isinstance(doc, Mapping):
        raise ModelFileError(f"field {name!r} must be an object with 'names', 'mean' and 'std'")
    normaliser = FeatureNormaliser.from_json(doc)
    if tuple(normaliser.names) != tuple(expected):
        raise ModelFileError(
            f"field '{name}.names' lists {len(normaliser.names)} features, this version computes "
            f"{len(expected)} ({', '.join(expected[:3])}, ...): retrain with `shardwise pretrain`"
        )
    if not all(math.isfinite(v) for v in (*normaliser.mean, *normaliser.std)) or min(normaliser.std) < 0:
        raise ModelFileError(f"field '{name}.mean'/'{name}.std' must be finite (std >= 0)")
    return normaliser
