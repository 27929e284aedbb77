"""A plan whose slowest device holds one shard alone: no placement of the other shards makes that plan faster, only
splitting the table does. Plans (predicted), measured plans and TorchRec's stats say so in one line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def slowest_alone(shards: Sequence[Sequence[str]], total_ms: Sequence[float], kind: str = "predicted",
                  ) -> dict[str, Any] | None:
    """Where the slowest device holds exactly one shard (names as plans show them: `t3`, `t7[0:32]`; data-parallel
    and row-wise tables, on every device, left out by the caller), that shard, its device's ms (`<kind>_ms`) and the
    balanced share: the devices' mean ms, what each would cost were the same work spread evenly. None otherwise, and
    on one device."""
    if len(total_ms) < 2 or len(shards) != len(total_ms):
        return None
    slowest = max(range(len(total_ms)), key=lambda d: total_ms[d])
    if len(shards[slowest]) != 1:
        return None
    shard = shards[slowest][0]
    return {"table": shard.split("[", 1)[0], "shard": shard, "alone": True, "device": slowest,
            f"{kind}_ms": round(float(total_ms[slowest]), 4),
            "balanced_share_ms": round(sum(float(ms) for ms in total_ms) / len(total_ms), 4)}


def bottleneck_line(bottleneck: Mapping[str, Any]) -> str:
    """One line for `slowest_alone`'s record: `t20 alone on device 2: 62.9 ms predicted, balanced share 52.9 ms`."""
    kind, ms = next((k[: -len("_ms")], v) for k, v in bottleneck.items() if k.endswith("_ms") and k != "balanced_share_ms")
    return (f"{bottleneck['shard']} alone on device {bottleneck['device']}: {_ms(ms)} ms {kind}, balanced share "
            f"{_ms(bottleneck['balanced_share_ms'])} ms")


def _ms(value: float) -> str:
    """Three significant digits, never an exponent."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
