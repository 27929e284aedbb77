"""The one error base: every failure a user can fix (a bad file, a missing model, a plan that cannot fit) is a
ShardwiseError. `shardwise` prints it as one line and exits 2; the traceback only with `--debug`."""

from __future__ import annotations

import re

#: user:password@ after a URI scheme
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


class ShardwiseError(Exception):
    """A user-facing failure whose message names the input that was wrong and what would be right."""

    #: the process exit status `shardwise` returns for it (2: bad input or missing prerequisite)
    exit_code = 2


def redacted(text: str) -> str:
    """`text` with any URI's user:password@ replaced by ***@ (secrets never appear in messages or logs)."""
    return _CREDENTIALS.sub("***@", text)
