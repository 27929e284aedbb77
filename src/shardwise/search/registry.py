"""The search-method registry: each method registers itself once, at the bottom of its own module, as a small
spec (name, factory, options model, what it needs). The CLI's choices and flags, the benchmark's method lists
and policy loading all read it; nothing else lists the methods. A new method is one new module plus its import
line in `shardwise/search/__init__.py`; registering imports no torch (`plan --help` lists the methods), so a method
whose module builds torch networks at import registers from a module that loads it when used (policy_methods)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from shardwise.errors import ShardwiseError
from shardwise.profiling import MeasurementSettings

from .placement import PlacementPolicy
from .policy_files import POLICY_FILE, PolicyError, find_policy_dir, read_policy_method
from .types import Searcher

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # a CLI choice and a registry-name component


class MethodError(ShardwiseError, ValueError):
    """An unknown search method, a duplicate registration, or options a method refuses."""


class MethodOptions(BaseModel):
    """Base of a method's options model: frozen, unknown options refused. Plain fields (int, float, str, bool,
    None-able, Literal) with `Field(description=...)` become `shardwise plan` flags; a field typed
    MeasurementSettings is filled in by the job."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class NoOptions(MethodOptions):
    """For methods without options."""


@dataclass(frozen=True)
class PolicyHooks:
    """What a method that plans with a trained placement policy adds: loading and training that policy."""

    #: (policy directory, torch device) -> policy
    load: Callable[[Path, str], PlacementPolicy]
    #: train(cost_model, tasks, seed, *, episodes: int, device: str | None, progress: bool) -> (policy, history)
    train: Callable[..., tuple[PlacementPolicy, list[dict[str, float]]]]


@dataclass(frozen=True)
class MethodSpec:
    """One search method as the registry knows it."""

    name: str
    #: factory(validated options) -> Searcher
    factory: Callable[[BaseModel], Searcher]
    options: type[BaseModel]
    #: one line, shown in `shardwise plan --help`
    description: str
    #: cannot search without a cost model
    needs_cost_model: bool = False
    #: learns from or searches with the cost model (not a baseline)
    learned: bool = False
    #: measures on hardware: `options` has `measurement: MeasurementSettings`
    measures: bool = False
    #: plans with a trained policy: `options` has `policy: str | None` (a local policy directory)
    policy: PolicyHooks | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise MethodError(f"method name {self.name!r}: use lower-case letters, digits and '_'")
        if not (isinstance(self.options, type) and issubclass(self.options, BaseModel)):
            raise MethodError(f"method {self.name!r}: options must be a pydantic model class, got {self.options!r}")
        fields = self.options.model_fields
        if self.measures and ("measurement" not in fields or fields["measurement"].annotation is not MeasurementSettings):
            raise MethodError(f"method {self.name!r} measures: its options need `measurement: MeasurementSettings`")
        if self.policy is not None and "policy" not in fields:
            raise MethodError(f"method {self.name!r} plans with a policy: its options need `policy: str | None`")


_METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add `spec` to the registry (after those already there); a name already taken is refused unless `replace`."""
    if spec.name in _METHODS and not replace:
        raise MethodError(f"search method {spec.name!r} is already registered; pick another name "
                          "(or pass replace=True to override it on purpose)")
    _METHODS[spec.name] = spec
    return spec


def unregister_method(name: str) -> None:
    """Remove a method (tests that register one of their own)."""
    get_method(name)
    del _METHODS[name]


def method_names() -> tuple[str, ...]:
    """Every registered method, in registration order."""
    return tuple(_METHODS)


def get_method(name: str) -> MethodSpec:
    """The spec registered as `name`; MethodError listing the registered names otherwise."""
    try:
        return _METHODS[name]
    except KeyError:
        raise MethodError(f"search method {name!r} is not registered; one of {', '.join(_METHODS)}") from None


def method_options(name: str, options: Mapping[str, object]) -> BaseModel:
    """`options` validated by the method's options model; MethodError naming each bad option."""
    spec = get_method(name)
    fields = spec.options.model_fields
    takes = ", ".join(fields) or "none"
    unknown = [key for key in options if key not in fields]
    if unknown:
        raise MethodError(
            f"method {name!r}: {', '.join(repr(k) for k in unknown)} is not one of its options (it takes: {takes})"
        )
    try:
        return spec.options.model_validate(dict(options))
    except ValidationError as err:
        problems = "; ".join(
            f"option {'.'.join(str(p) for p in e['loc'])!r}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        )
        raise MethodError(f"method {name!r}: {problems}") from None


def make_searcher(name: str, **options: object) -> Searcher:
    """The searcher registered as `name`, built from `options` (validated by the method's options model)."""
    return get_method(name).factory(method_options(name, options))


def load_policy_dir(directory: str | Path, device: str = "cpu") -> PlacementPolicy:
    """The trained policy saved in `directory` (or below it), loaded by the method its policy.json names."""
    root = find_policy_dir(directory)
    method = read_policy_method(root)
    spec = _METHODS.get(method)
    if spec is None or spec.policy is None:
        known = ", ".join(n for n, s in _METHODS.items() if s.policy is not None)
        raise PolicyError(f"{root / POLICY_FILE}: field 'method' is {method!r}, expected one of {known}")
    return spec.policy.load(root, device)
