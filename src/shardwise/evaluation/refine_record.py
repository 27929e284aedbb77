"""What refinement did (`Refinement`: its rounds, the measured slowest device before and after), apart from the
refining (torch, the kernels): a job's results are declared without it."""

from __future__ import annotations

from pydantic import BaseModel


class RefinementRound(BaseModel):
    """One round: the measured slowest device before, what changed, and whether it was kept."""

    round: int
    measured_max_ms: float  #: the slowest device's measured compute + all-to-all before this round
    slowest_device: int
    #: "t3[0] 0->2" (a move), "t3[0] 0->2, t7[0] 2->0" (a swap), several joined by "; "; "" when nothing
    #: promised a gain
    change: str
    predicted_max_ms: float | None = None  #: the corrected prediction of the change
    after_ms: float | None = None  #: measured after the change
    kept: bool = False
    seconds: float = 0.0

    @property
    def described(self) -> str:
        """What the round changed, as the terminal and the report show it."""
        return self.change or "nothing promised a gain"


class Refinement(BaseModel):
    """What refinement did: every round, the measured slowest device before and after, and the time it took."""

    rounds: list[RefinementRound]
    #: the measured slowest device of each plan refinement could start from, by method; it went on from the fastest
    starts: dict[str, float] = {}
    start: str = ""
    #: starts asked for and not measured, and why (the measured-cost greedy when its tables' timings did not fit)
    left_out: dict[str, str] = {}
    #: the start's and the returned plan's measured slowest device, side by side in one session: the second paired
    #: session's where the plan departs from the starts given, else the final paired check's when a round kept a
    #: change, else the first session's (nothing changed); so they may differ from `starts`. Where the time budget
    #: left no room for the final check, the first session's and the last kept round's
    before_ms: float
    after_ms: float
    seconds: float
    devices_measured: int
    #: why it ended: the rounds were done, a round promised nothing, or the time budget was spent
    stopped: str = ""

    def table(self) -> str:
        """One line per round, then the measured slowest device before and after and the time it took."""
        lines = [f"{'round':>5}  {'slowest ms':>10}  {'device':>6}  {'after ms':>8}  {'kept':>4}  change"]
        for r in self.rounds:
            after = f"{r.after_ms:.3f}" if r.after_ms is not None else "-"
            lines.append(f"{r.round:>5}  {r.measured_max_ms:>10.3f}  {r.slowest_device:>6}  {after:>8}  "
                         f"{'yes' if r.kept else 'no':>4}  {r.described}")
        if len(self.starts) > 1:
            lines.insert(0, "start: " + ", ".join(f"{m} {ms:.3f} ms" for m, ms in self.starts.items())
                         + f" measured; refined from {self.start}")
        lines[:0] = [f"start {method} left out: {why}" for method, why in self.left_out.items()]
        lines.append(f"refinement: {self.outcome()}")
        return "\n".join(lines)

    def outcome(self) -> str:
        """The measured slowest device before and after, what it cost and why it stopped, in one line."""
        return (f"slowest device {self.before_ms:.3f} -> {self.after_ms:.3f} ms, measured side by side in one "
                f"session ({self.after_ms / self.before_ms:.3f}x), {self.devices_measured} device shards timed in "
                f"{self.seconds:.1f} s" + (f"; stopped: {self.stopped}" if self.stopped else ""))
