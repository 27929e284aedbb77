"""A local cost dataset's part files (`dataset.py`): each append is one new part file with a name no other writer
can pick (time, host, process, random), written under a hidden temp name and renamed into place; the temp files a
killed writer left are removed; a dataset from before part files (one Parquet file) is turned into a directory with
the old file as its first part (hard link, unlink, rename: the old rows are never copied or rewritten), and a
conversion a killed process left half done is finished."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import socket
import time
import uuid
from pathlib import Path

#: part files are named `part-<unix ns>-<host>-<pid>-<random>.parquet`, so that sorting them is time order
PART_PREFIX = "part-"
#: the single file of a dataset from before part files becomes the part that sorts first
_LEGACY_PART_PREFIX = f"{PART_PREFIX}{0:020d}-legacy-"


#: a temporary part older than this is a writer's leftover whatever host wrote it (a part takes seconds to write)
STALE_TEMP_PART_S = 3600.0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:40] or "host"


def _part_name() -> str:
    return f"{PART_PREFIX}{time.time_ns():020d}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.parquet"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_temp_parts(path: Path) -> int:
    """Delete the hidden `.part-*.tmp` files a killed writer left (readers skip them, nothing else would remove
    them): those of a dead process on this host, and any older than STALE_TEMP_PART_S. Returns how many."""
    removed = 0
    for tmp in path.glob(f".{PART_PREFIX}*.tmp"):
        tokens = tmp.name.removeprefix(f".{PART_PREFIX}").removesuffix(".parquet.tmp").split("-")
        try:
            stale = time.time() - tmp.stat().st_mtime > STALE_TEMP_PART_S
            if not stale and len(tokens) >= 4 and "-".join(tokens[1:-2]) == _host() and tokens[-2].isdigit():
                stale = not _pid_alive(int(tokens[-2]))
            if stale:
                tmp.unlink()
                removed += 1
        except OSError:  # another writer removed it first, or it finished and renamed it
            continue
    return removed


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened or synced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _staging_dirs(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.converting-*"))


def _recover_conversions(path: Path) -> None:
    """Finish conversions that a killed process left half done: old rows parked in a hidden sibling directory
    are moved into the dataset, unless the dataset already holds that very file (a hard link to it)."""
    if path.exists() and not path.is_dir():
        return  # still a single file: its conversion finishes first, then the leftovers are seen to
    for staging in _staging_dirs(path):
        if not path.exists():
            with contextlib.suppress(OSError):  # another process may be finishing it right now
                os.rename(staging, path)
            continue
        held = {(st.st_dev, st.st_ino) for st in (p.stat() for p in path.iterdir() if p.is_file())}
        for part in staging.glob("*.parquet"):
            with contextlib.suppress(OSError):
                st = part.stat()
                if (st.st_dev, st.st_ino) in held:
                    part.unlink()
                else:
                    os.rename(part, path / part.name)
        with contextlib.suppress(OSError):
            staging.rmdir()


def _convert_single_file(path: Path) -> bool:
    """Turn a one-file dataset into a directory holding that file as its first part; False if another process
    got there first. Hard link, unlink, rename: each step refuses directories and only one process wins."""
    staging = path.with_name(f".{path.name}.converting-{uuid.uuid4().hex[:12]}")
    legacy = staging / f"{_LEGACY_PART_PREFIX}{uuid.uuid4().hex[:12]}.parquet"
    try:
        staging.mkdir()
        try:
            os.link(path, legacy)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            return False  # gone or a directory already: another writer converted it
        try:
            os.unlink(path)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            legacy.unlink()
            return False
        try:
            os.rename(staging, path)  # path is free: the dataset reappears whole, old rows first
        except FileNotFoundError:
            pass  # a concurrent recovery moved it into place already
        except OSError:  # a writer created the directory meanwhile: add the old rows to it
            os.rename(legacy, path / legacy.name)
        _fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(OSError):
            staging.rmdir()

