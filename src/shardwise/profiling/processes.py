"""Starting shardwise's "spawn" children without re-running the user's script in each of them.

A spawned child imports the parent's `__main__` (by its module name, else its file) before it unpickles its
target, so a script that plans without an `if __name__ == "__main__":` guard would run again in every child and
fail in multiprocessing's bootstrapping check. Every child shardwise starts runs a function of a shardwise module,
so while the children start, the main module is hidden from spawn's preparation."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Within the block, `__main__` has no `__spec__` and no `__file__`, so a child started then with the "spawn"
    method does not import it; both are restored on leaving. Start processes here, and wait for them outside:
    other threads of the parent see the main module without its name and path for as long as the block lasts."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    spec = main.__spec__
    names = vars(main)
    had_path, path = "__file__" in names, names.get("__file__")
    try:
        main.__spec__ = None  # spawn reads `__spec__.name` first: None, not absent, is what it expects
        names.pop("__file__", None)
        yield
    finally:
        main.__spec__ = spec
        if had_path:
            names["__file__"] = path
