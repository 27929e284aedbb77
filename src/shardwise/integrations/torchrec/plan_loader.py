"""TorchRec's `PlanLoader`, backed by the plan registry: a training job loads its model's registered plan.

    enumerator = ShardwiseEnumerator(topology=topology, batch_size=512, constraints=constraints)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=512, constraints=constraints,
                                       enumerator=enumerator,
                                       plan_loader=MlflowPlanLoader("models:/shardwise-plan-ranking@champion",
                                                                    enumerator=enumerator))
    plan = planner.collective_plan(model, sharders, pg)

TorchRec's planner asks the loader for the registered plan's context hash and compares it with its own
(`hash_planner_context_inputs_str`: topology, batch size, the enumerated options, storage reservation, constraints);
equal, it takes the registered shards instead of planning. Given the planner's enumerator (the drop-in gives its own),
the loader names what changed when they differ (a table's rows, a new table, another world size). The enumerator
is shardwise's where plans split tables into column slices: TorchRec's offers one column-wise option per table, and a
registered option is matched by `storage_hash`, which counts the slices.

Under TorchRec's own `collective_plan` only rank 0 plans, and the other ranks wait for its broadcast: where the
loader refuses (a changed model, a plan that does not load), it sends its error to the waiting ranks before raising it,
so that every rank raises the same one line at once instead of waiting out the process group's timeout.

A registered plan holds, beside shardwise's plan, `torchrec_plan.json` (`shardwise.torchrec-plan/v1`): the context
hash, the fingerprint, and per option its storage hash and shards (sizes, offsets, ranks, TorchRec's estimates).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn
from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Perf,
    PlanLoader,
    PlannerErrorType,
    Shard,
    ShardingOption,
    Storage,
)

from ..plan_registry import RegisteredPlan, load_registered_plan
from .errors import PlannerError

FORMAT: Literal["shardwise.torchrec-plan/v1"] = "shardwise.torchrec-plan/v1"
FILE = "torchrec_plan.json"


class ShardDoc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    size: tuple[int, int]
    offset: tuple[int, int]
    rank: int
    storage: tuple[int, int, int] | None = None  # hbm, ddr, ssd bytes
    perf: dict[str, float] | None = None


class OptionDoc(BaseModel):
    """One table's chosen option: what `ShardingOption.storage_hash` reads, and its placed shards."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fqn: str
    name: str
    storage_hash: int
    sharding_type: str
    compute_kernel: str
    partition_by: str
    rows: int
    dim: int
    shards: tuple[ShardDoc, ...]


class TorchRecPlanDoc(BaseModel):
    """A TorchRec plan as its `PlanLoader` returns it, with the context it was made in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["shardwise.torchrec-plan/v1"] = FORMAT
    context_hash: str
    fingerprint: dict[str, Any]
    options: tuple[OptionDoc, ...]


def plan_doc(best_plan: Sequence[ShardingOption], context_hash: str, fingerprint: dict[str, Any]) -> TorchRecPlanDoc:
    """A planner's chosen options (`ShardwisePlanner.last_best_plan` after `plan`) as a document."""
    options = []
    for option in best_plan:
        if any(s.rank is None for s in option.shards):
            raise PlannerError(f"{option.fqn}: a shard without a rank; only a placed plan is registered",
                               PlannerErrorType.OTHER)
        options.append(OptionDoc(
            fqn=option.fqn, name=option.name, storage_hash=option.storage_hash(), sharding_type=option.sharding_type,
            compute_kernel=option.compute_kernel, partition_by=option.partition_by,
            rows=int(option.tensor.shape[0]), dim=int(option.tensor.shape[1]),
            shards=tuple(ShardDoc(
                size=(int(s.size[0]), int(s.size[1])), offset=(int(s.offset[0]), int(s.offset[1])), rank=int(s.rank or 0),
                storage=(s.storage.hbm, s.storage.ddr, s.storage.ssd) if s.storage else None,
                perf={k: float(v) for k, v in vars(s.perf).items()} if s.perf else None)
                for s in option.shards)))
    return TorchRecPlanDoc(context_hash=context_hash, fingerprint=fingerprint, options=tuple(options))


def enumerated_fingerprint(enumerator: Enumerator) -> dict[str, Any] | None:
    """What the planner's enumerator saw (its last search space, world size, batch size, constraints); None before
    it enumerated."""
    space = getattr(enumerator, "last_stored_search_space", None)
    if not space:
        return None
    constraints = getattr(enumerator, "_constraints", None) or {}
    return {
        "tables": {o.fqn: [int(o.tensor.shape[0]), int(o.tensor.shape[1])] for o in space},
        "world_size": getattr(enumerator, "_world_size", None),
        "compute_device": getattr(enumerator, "_compute_device", None),
        "batch_size": getattr(enumerator, "_batch_size", None),
        "constraints": {t: _set_fields(c) for t, c in sorted(constraints.items())},
    }


def changes(registered: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints (`plan_loader.enumerated_fingerprint`: what a planner's enumerator
    saw), each in a few words: a table's rows, a new table, the world size."""
    said: list[str] = []
    old_tables, new_tables = dict(registered.get("tables", {})), dict(current.get("tables", {}))
    for fqn in sorted(new_tables.keys() - old_tables.keys()):
        said.append(f"new table {fqn!r}")
    for fqn in sorted(old_tables.keys() - new_tables.keys()):
        said.append(f"table {fqn!r} is gone")
    for fqn in sorted(old_tables.keys() & new_tables.keys()):
        (rows, dim), (now_rows, now_dim) = old_tables[fqn], new_tables[fqn]
        if rows != now_rows:
            said.append(f"table {fqn!r} rows {rows} -> {now_rows}")
        if dim != now_dim:
            said.append(f"table {fqn!r} dim {dim} -> {now_dim}")
    for key, label in (("world_size", "world size"), ("compute_device", "compute device"),
                       ("batch_size", "batch size per rank")):
        if key in current and registered.get(key) != current[key]:
            said.append(f"{label} {registered.get(key)} -> {current[key]}")
    old_constraints, new_constraints = dict(registered.get("constraints", {})), dict(current.get("constraints", {}))
    for table in sorted(old_constraints.keys() | new_constraints.keys()):
        before, now = old_constraints.get(table, {}), new_constraints.get(table, {})
        if before != now:
            fields = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
            said.append(f"table {table!r}'s constraints ({', '.join(fields)})")
    return said


def _set_fields(constraint: ParameterConstraints) -> dict[str, str]:
    """A constraint's fields that differ from `ParameterConstraints()`'s, each as its repr."""
    default = ParameterConstraints()
    return {f.name: repr(getattr(constraint, f.name)) for f in dataclasses.fields(constraint)
            if getattr(constraint, f.name) != getattr(default, f.name)}


class MlflowPlanLoader(PlanLoader):
    """The plan registered at `uri` (`models:/shardwise-plan-<task>@champion`, a version, or a directory), read
    through the local registry cache, for TorchRec's planner (`plan_loader=`)."""

    def __init__(self, uri: str | Path, *, tracking_uri: str | None = None,
                 enumerator: Enumerator | None = None) -> None:
        self.uri = str(uri)
        self.tracking_uri = tracking_uri
        self.enumerator = enumerator
        self._registered: RegisteredPlan | None = None
        self._doc: TorchRecPlanDoc | None = None

    @property
    def registered(self) -> RegisteredPlan:
        """The registered plan (read once)."""
        if self._registered is None:
            try:
                self._registered = load_registered_plan(self.uri, tracking_uri=self.tracking_uri)
            except json.JSONDecodeError as err:  # which file: the version's files are shardwise's, all JSON
                raise PlannerError(f"{self.uri}: a file of the registered plan is not JSON ({err}); register it "
                                   "again with `shardwise publish`", PlannerErrorType.PLAN_LOADING_FAILED) from None
            except Exception as err:  # a registry that is down, a version not found: TorchRec's error, one line
                line = str(err).splitlines()[0] if str(err) else type(err).__name__
                # the registry's errors name the URI already
                raise PlannerError(line if line.startswith(self.uri) else f"{self.uri}: {line}",
                                   PlannerErrorType.PLAN_LOADING_FAILED) from None
        return self._registered

    @property
    def doc(self) -> TorchRecPlanDoc:
        if self._doc is None:
            raw = self.registered.torchrec
            if raw is None:
                raise PlannerError(f"{self.uri}: the registered plan has no {FILE} (it was not made by TorchRec's "
                                   "planner); plan it with `shardwise publish`", PlannerErrorType.PLAN_LOADING_FAILED)
            try:
                self._doc = TorchRecPlanDoc.model_validate(raw)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise PlannerError(f"{self.uri}: {FILE}: {where}: {first['msg']} (not a {FORMAT} file); plan it "
                                   "again with `shardwise publish`", PlannerErrorType.PLAN_LOADING_FAILED) from None
        return self._doc

    def plan_context_hash(self) -> str | None:
        """The registered plan's context hash; where the planner's enumerator is known and saw other inputs, a
        `PlannerError` naming what changed (under TorchRec's `collective_plan`, raised on every rank)."""
        waiting = _waiting_ranks()
        try:
            doc = self.doc
            seen = enumerated_fingerprint(self.enumerator) if self.enumerator is not None else None
            changed = changes(doc.fingerprint, seen) if seen is not None else []
            planner = waiting.planner if waiting is not None else None
            if not changed and planner is not None and planner.hash_planner_context_inputs_str() != doc.context_hash:
                # TorchRec's planner would refuse it on this rank alone, the others left waiting
                changed = ["the planner's context hash (its topology, storage reservation, sharders or options)"]
            if changed:
                raise PlannerError(
                    f"{self.uri} (v{self.registered.version}) was planned for other inputs: {'; '.join(changed)}; "
                    "plan again (`shardwise publish`) or plan without plan_loader",
                    PlannerErrorType.PLANNER_INPUT_CONTEXT_MISMATCH)
        except PlannerError as err:
            _raise_on_every_rank(err, waiting)
        return doc.context_hash

    def load(self) -> dict[int, ShardingOption] | None:
        """The registered options by storage hash (TorchRec's planner takes their shards)."""
        try:
            return {o.storage_hash: _option(o) for o in self.doc.options}
        except PlannerError as err:
            _raise_on_every_rank(err, _waiting_ranks())

    def get_plan_id(self) -> str:
        return f"{self.registered.name}/{self.registered.version}" if self.registered.version else self.uri


def _option(doc: OptionDoc) -> ShardingOption:
    """A `ShardingOption` carrying the registered shards (TorchRec's planner reads their shards only)."""
    return ShardingOption(
        name=doc.name, tensor=torch.empty((doc.rows, doc.dim), device="meta"), module=(doc.fqn, nn.Module()),
        input_lengths=[1.0], batch_size=1, sharding_type=doc.sharding_type, partition_by=doc.partition_by,
        compute_kernel=doc.compute_kernel,
        shards=[Shard(size=list(s.size), offset=list(s.offset), rank=s.rank,
                      storage=Storage(*s.storage) if s.storage else None,
                      perf=Perf(**s.perf) if s.perf else None) for s in doc.shards])


@dataclasses.dataclass(frozen=True)
class _Waiting:
    """Where TorchRec's `collective_plan` runs the planner on this rank: its group, the planning rank (as TorchRec
    broadcasts from it) and the planner."""

    group: Any
    src: int
    planner: Any


def _waiting_ranks() -> _Waiting | None:
    """The group whose other ranks wait for this rank's plan, where TorchRec's `collective_plan` runs this planner
    (`invoke_on_rank_and_broadcast_result` on the stack, on its planning rank, in a group of several); else None."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code is not invoke_on_rank_and_broadcast_result.__code__:
        frame = frame.f_back
    if frame is None:
        return None
    group, src, func = frame.f_locals.get("pg"), frame.f_locals.get("rank"), frame.f_locals.get("func")
    if group is None or not isinstance(src, int) or group.size() < 2 or group.rank() != src:
        return None
    return _Waiting(group, src, getattr(func, "__self__", None))


def _raise_on_every_rank(err: PlannerError, waiting: _Waiting | None) -> NoReturn:
    """Raise `err` here, first sending it to the ranks waiting for this rank's plan (as TorchRec broadcasts the plan):
    they raise it as they receive it."""
    if waiting is not None:
        dist.broadcast_object_list([_RaisedOnArrival(str(err), err.error_type.name)], waiting.src, group=waiting.group)
    raise err


@dataclasses.dataclass(frozen=True)
class _RaisedOnArrival:
    """The planning rank's error in place of its plan: unpickled on a waiting rank, it raises there."""

    message: str
    error_type: str

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return _raise_planner_error, (self.message, self.error_type)


def _raise_planner_error(message: str, error_type: str) -> NoReturn:
    raise PlannerError(message, PlannerErrorType[error_type])
