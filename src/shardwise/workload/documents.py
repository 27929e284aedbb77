"""Reading and writing the versioned JSON documents (tasks, table sets, plans) with field-naming errors.

Reading refuses, with the document's own error class and one line: a missing path, a directory, a file over
`MAX_DOCUMENT_BYTES`, bytes that are not UTF-8, JSON that is invalid or nested too deeply, and a key given
twice in one object. The field types below refuse what JSON or Python would silently coerce: booleans and
strings for numbers, and non-finite numbers (`NaN`, `Infinity`, and `1e999`, which JSON parses as infinity)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import uuid
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationError

from shardwise.errors import ShardwiseError

#: the largest document read: a table set of 100,000 tables with reuse bins is about 50 MB
MAX_DOCUMENT_BYTES = 256 * 2**20


def describe_validation_error(err: ValidationError) -> str:
    """`field 'tables.3.dim': dim 30 is not a multiple of 4; ...` from a pydantic error."""
    errors = err.errors()
    # pydantic also reports a tuple as too short once its bad items are dropped: noise beside the causes
    causes = [e for e in errors if "after validation" not in e["msg"]] or errors
    return "; ".join(
        f"field '{'.'.join(str(p) for p in e['loc']) or '(document)'}': {e['msg'].removeprefix('Value error, ')}"
        for e in causes
    )


def _describe(value: object) -> str:
    """How a wrong JSON value reads in a message: `the string '4'`, `the boolean true`, `the number inf`."""
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, float):
        return f"the number {value}"
    return f"a {type(value).__name__}"


def _integer(value: object) -> object:
    """Refuse booleans, strings and non-finite numbers where an integer belongs (pydantic would take `true`
    as 1 and `"4"` as 4); integral floats such as 4e9 stay accepted, fractional ones pydantic refuses."""
    if isinstance(value, bool | str) or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"expected an integer, got {_describe(value)}")
    return value


def _finite_number(value: object) -> object:
    """Refuse booleans, strings and NaN or infinite numbers where a finite number belongs."""
    if isinstance(value, bool | str):
        raise ValueError(f"expected a finite number, got {_describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value} (NaN and Infinity are not measurements)")
    return value


#: an integer field that refuses `true`, `"4"` and `Infinity` instead of coercing them
StrictInt = Annotated[int, BeforeValidator(_integer)]
#: a float field that refuses booleans, strings, `NaN` and `Infinity`
FiniteFloat = Annotated[float, BeforeValidator(_finite_number)]


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"field {key!r} appears twice in one object (which one was meant?)")
        doc[key] = value
    return doc


def read_json_document(path: str | Path, error: type[Exception], what: str) -> Any:
    """The parsed JSON of `path`, or `error` saying in one line why the `what` file cannot be read."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a directory, expected a {what} file (JSON)")
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise error(f"{path}: not a regular file, expected a {what} file (JSON)")
    try:
        with path.open("rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except OSError as err:
        raise error(f"{path}: cannot read the {what} file ({err.strerror or err})") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise error(f"{path}: over {MAX_DOCUMENT_BYTES // 2**20} MiB, too large for a {what} file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
            f"a {what} file is JSON in UTF-8"
        ) from None
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except json.JSONDecodeError as err:
        raise error(f"{path}: not valid JSON ({err})") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to be a {what} file") from None
    except ValueError as err:  # a duplicate key, or an integer of more than 4300 digits
        raise error(f"{path}: not a valid {what} file ({err})") from None


def refuse_directory(path: str | Path, error: type[Exception] = ShardwiseError) -> None:
    """A file about to be written whose path is a directory is refused with `error` (check it before long work)."""
    if Path(path).is_dir():
        raise error(f"{path}: is a directory; give the path of a file to write")


def write_json_document(doc: Any, path: str | Path, error: type[Exception] = ShardwiseError) -> Path:
    """Write `doc` as JSON atomically (temp file + rename: a reader never sees half a file).

    A destination that is a directory, or that cannot be written, is refused with `error`; no temp file is left
    behind on any failure."""
    path = Path(path)
    refuse_directory(path, error)
    text = json.dumps(doc, indent=1)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as err:
        raise error(f"{path}: cannot write it ({err.strerror or err})") from None
    finally:
        with contextlib.suppress(OSError):  # gone after the rename; never mask the error being raised
            tmp.unlink(missing_ok=True)
    return path
