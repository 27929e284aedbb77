"""Names a package loads on first use: its heavy modules (pandas, scipy) stay unimported until one of their names
is asked for, so that `shardwise plan` does not pay for what only training and evaluation use."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any


def on_first_use(package: str, modules: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `package.<module>` when one of its `modules[module]`
    names is first asked for (PEP 562); any other name is an AttributeError, as without it."""
    home = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{home[name]}"), name)

    return __getattr__
