"""A profile run's time budget: whole shards are measured until the budget is spent, never fewer than a floor, so
the same run fits a slow laptop and a fast workstation alike; what it left is measured by the next run (the
configs are seeded, so a rerun skips what is stored and goes on from there)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: shards timed before the rate is trusted enough to say that the floor overruns the budget (the first ten ran
#: at about two thirds of a run's rate on 2 CPU cores), and by how much it must overrun to be worth a line
RATE_PROBE_SHARDS = 25
OVERRUN_SAID = 1.2


@dataclass
class ShardClock:
    """Decides, after each measured shard, whether the next one still fits `budget_s` (None: no budget); counts
    whole shards (a shard's row blocks and caching variants ride along with it)."""

    budget_s: float | None
    floor_shards: int = 0
    say: Callable[[str], None] | None = print  # None: the floor's overrun goes unsaid (an earlier part said it)
    started: float = field(default_factory=time.monotonic)  # the run's start: its other measurements count too
    shards_started: float | None = None  # when the first whole shard began
    shards: int = 0  # whole shards measured by this run
    warned: bool = False

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def shard_s(self) -> float:
        """Seconds a whole shard has taken here (its row blocks and variants included)."""
        began = self.started if self.shards_started is None else self.shards_started
        return (time.monotonic() - began) / max(self.shards, 1)

    def begin(self) -> None:
        self.shards_started = time.monotonic()

    def measured(self, whole_shard: bool) -> None:
        if whole_shard:
            self.shards += 1
            if self.shards == RATE_PROBE_SHARDS:
                self._warn_if_floor_overruns()

    def next_fits(self) -> bool:
        """Whether to start the next shard: always below the floor, then while the budget lasts at this rate."""
        if self.budget_s is None or self.shards < self.floor_shards:
            return True
        return self.elapsed_s + self.shard_s <= self.budget_s

    def _warn_if_floor_overruns(self) -> None:
        if self.budget_s is None or self.warned or self.say is None:
            return
        floor_s = self.elapsed_s + self.shard_s * (self.floor_shards - self.shards)
        if floor_s > OVERRUN_SAID * self.budget_s:
            self.warned = True
            self.say(f"profile: this machine measures {1 / self.shard_s:.1f} shards/s, so the floor of "
                     f"{self.floor_shards} shards takes about {_duration(floor_s)}, past the budget of "
                     f"{_duration(self.budget_s)}: the step will take that long")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def floor_shards(num_shards: int, share: float) -> int:
    """The fewest of `num_shards` a budgeted run measures: `share` of them, at least one."""
    return min(num_shards, max(1, math.ceil(share * num_shards)))


def rate_line(shards: int, elapsed_s: float, left: int) -> str:
    """"560 shards in 4.1 min at 2.3 shards/s", and how many the time budget left when it left some."""
    line = f"{shards} shards in {_duration(elapsed_s)} at {shards / max(elapsed_s, 1e-9):.1f} shards/s"
    return line + (f" ({left} left by the time budget)" if left else "")
