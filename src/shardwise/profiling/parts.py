"""A local cost dataset's part files (`dataset.py`): each append is one new part file with a name no other writer
can pick (time, host, process, random), written under a hidden temp name and renamed into place; the temp files a
killed writer left are removed."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
import uuid
from pathlib import Path

#: part files are named `part-<unix ns>-<host>-<pid>-<random>.parquet`, so that sorting them is time order
PART_PREFIX = "part-"


#: a temporary part older than this is a writer's leftover whatever host wrote it (a part takes seconds to write)
STALE_TEMP_PART_S = 3600.0


def host_name() -> str:
    """This host's name as part file names carry it (at most 40 characters, any but [A-Za-z0-9.-] as "_")."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:40] or "host"


def part_name() -> str:
    """A new part file's name, one no other writer can pick."""
    return f"{PART_PREFIX}{time.time_ns():020d}-{host_name()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.parquet"


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
            if not stale and len(tokens) >= 4 and "-".join(tokens[1:-2]) == host_name() and tokens[-2].isdigit():
                stale = not _pid_alive(int(tokens[-2]))
            if stale:
                tmp.unlink()
                removed += 1
        except OSError:  # another writer removed it first, or it finished and renamed it
            continue
    return removed


def fsync_dir(directory: Path) -> None:
    """Sync `directory` itself, so that a file renamed into it stays after a crash."""
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened or synced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
