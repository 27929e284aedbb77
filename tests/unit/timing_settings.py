"""Timing settings the measuring tests share."""

#: the cache flush they time with, MiB: they check behaviour, not how cold a kernel starts, and the protocol's own
#: flush (twice the last-level cache, up to 64 MiB on a CPU, before every timed call) took most of the suite's
#: time on a server CPU whose last-level cache is large
FLUSH_MIB = 16
