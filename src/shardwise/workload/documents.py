"""Reading and writing the versioned JSON documents (tasks, table sets, plans) with field-naming errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError


def describe_validation_error(err: ValidationError) -> str:
    """`field 'tables.3.dim': dim 30 is not a multiple of 4; ...` from a pydantic error."""
    errors = err.errors()
    # pydantic also reports a tuple as too short once its bad items are dropped: noise beside the causes
    causes = [e for e in errors if "after validation" not in e["msg"]] or errors
    return "; ".join(
        f"field '{'.'.join(str(p) for p in e['loc']) or '(document)'}': {e['msg'].removeprefix('Value error, ')}"
        for e in causes
    )


def read_json_document(path: str | Path, error: type[Exception], what: str) -> Any:
    """The parsed JSON of `path`, or `error` saying the `what` file is missing or not JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except json.JSONDecodeError as err:
        raise error(f"{path}: not valid JSON ({err})") from None


def write_json_document(doc: Any, path: str | Path) -> Path:
    """Write `doc` as JSON atomically (temp file + rename: a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)
    return path
