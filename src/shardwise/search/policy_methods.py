"""DreamShard and AutoShard as the registry knows them. Each method's networks and training (torch) live in its own
module (dreamshard.py, autoshard.py, each with its `HOOKS`), imported when one of its policies is first loaded or
trained: listing the methods (`shardwise plan --help`, a command line's mistakes) imports no torch."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

from .placement import PlacementPolicy
from .policy_search import PolicyOptions, policy_factory
from .registry import MethodSpec, PolicyHooks, register_method


def _hooks(module: str) -> PolicyHooks:
    """The hooks of the method implemented in `module` (which defines HOOKS), that module imported on first use."""

    def load(directory: Path, device: str) -> PlacementPolicy:
        return import_module(f"{__package__}.{module}").HOOKS.load(directory, device)

    def train(*args: Any, **kwargs: Any) -> tuple[PlacementPolicy, list[dict[str, float]]]:
        return import_module(f"{__package__}.{module}").HOOKS.train(*args, **kwargs)

    return PolicyHooks(load=load, train=train)


#: each policy method (its module's name) and its one line in `shardwise plan --help`, in registration order
_DESCRIPTIONS = {
    "dreamshard": "a placement policy trained by REINFORCE on an estimated MDP of the cost model",
    "autoshard": "a recurrent actor-critic placement policy trained against the cost model",
}
for _method, _description in _DESCRIPTIONS.items():
    _method_hooks = _hooks(_method)
    register_method(MethodSpec(
        name=_method,
        factory=policy_factory(_method, _method_hooks.load),
        options=PolicyOptions,
        description=_description,
        needs_cost_model=True,
        learned=True,
        policy=_method_hooks,
    ))
