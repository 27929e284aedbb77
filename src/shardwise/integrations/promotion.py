"""The one promotion gate: a registered version takes the `champion` alias only on measured evidence.

Cost models and placement policies both go through `promote`: the new version's metric (lower is better) is
compared with the champion's, the version takes `champion` if it wins and `challenger` if not, and the evidence
(metric, both values, the champion it was compared with, the decision) is kept as tags on the model version and
as metrics and tags on its run. A `Guard` is a second metric the version must also be no worse on than the
champion (a cost model's error on the costliest held-out shards, which decide a plan)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .mlflow_process import mlflow_metrics
from .mlflow_registry import NOT_FOUND_CODES, RegistryError

if TYPE_CHECKING:
    from mlflow import MlflowClient

CHAMPION = "champion"
CHALLENGER = "challenger"


@dataclass(frozen=True)
class Promotion:
    """Where a new version landed and the evidence that decided it (lower `metric` is better)."""

    name: str
    version: str
    alias: str
    metric: str
    new_value: float
    champion_version: str | None
    champion_value: float | None
    reason: str = ""
    #: each guard's metric -> (the new version's value, the champion's; None where it had none)
    guard_values: dict[str, tuple[float, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Guard:
    """A second metric (lower is better) the new version must be no worse on than the champion, measured on the same
    data: `champion_value` gives the champion's from its models:/<name>/<version> URI; None (a champion without
    it) leaves the decision to the gate's metric alone."""

    metric: str
    new_value: float
    champion_value: Callable[[str], float | None]


#: seconds between moving `champion` and reading it back: longer than another run takes between reading the
#: champion and moving the alias (one request on loopback, tens of ms under load), so a move that overwrote
#: another run's is seen by one of the two
GATE_SETTLE_S = 1.0
_GATE_ROUNDS = 8  # comparisons before giving up on a champion that keeps moving


def promote(
    client: MlflowClient,
    name: str,
    version: str,
    *,
    metric: str,
    new_value: float,
    champion_value: Callable[[str], float | None] | None,
    stores: str,
    min_gain: float = 0.0,
    guards: Sequence[Guard] = (),
) -> Promotion:
    """Give `version` the `champion` alias if its `metric` (lower is better) beats the champion's by more than
    `min_gain` of it (a measured noise), else `challenger`; keep the evidence on the version (tags) and on its run
    (metrics, tags). A version that wins on `metric` but is worse than the champion on a `guards` metric takes
    `challenger`, the reason naming that metric; a champion without a guard's value is compared on `metric` alone.

    No champion yet: the new version wins. A champion that cannot be compared (`champion_value` is None or
    returns None for its models:/<name>/<version> URI): the newer version wins. No finite `new_value`
    (nothing to measure it on): `challenger`, a champion is never replaced blindly.

    Runs registering at once, and a server that dies mid-way: the evidence is stored on the version before its
    alias moves (an alias never points at a version the gate did not finish), the champion is read again right
    before the alias moves (one that moved during the comparison is compared with instead), and again
    GATE_SETTLE_S after (a run that moved it in between is compared with, and the better takes it back)."""
    version = str(version)
    compared: dict[str, float | None] = {}  # champion version -> its metric (each compared once)
    guarded: dict[tuple[str, str], float | None] = {}  # (champion version, guard metric) -> its value

    def decide(current: str | None) -> tuple[bool, str]:
        if current is None:
            return True, "no champion yet"
        if current == version:
            return True, "already the champion"
        if not math.isfinite(new_value):
            return False, f"no {metric} to compare on: a champion is never replaced blindly"
        if current not in compared:
            compared[current] = champion_value(f"models:/{name}/{current}") if champion_value else None
        if compared[current] is None:
            newer = int(version) > int(current)
            return newer, f"champion v{current} is not comparable: the newer version wins"
        bar = compared[current] * (1.0 - min_gain)  # type: ignore[operator]
        wins = new_value < bar
        than = f"champion v{current}'s {compared[current]:.6g}" + (f" less {min_gain:.2%}" if min_gain else "")
        reason = f"{metric} {new_value:.6g} {'<' if wins else '>='} {than}"
        for guard in guards:  # each compared (the evidence has both figures), a refusal only where it would win
            worse, said = check_guard(guard, current)
            reason += f"; {said}"
            wins = wins and not worse
        return wins, reason

    def check_guard(guard: Guard, current: str) -> tuple[bool, str]:
        """Whether the new version is worse than champion `current` on `guard`, and what was found."""
        key = (current, guard.metric)
        if key not in guarded:
            value = guard.champion_value(f"models:/{name}/{current}")
            guarded[key] = value if value is not None and math.isfinite(value) else None
        theirs = guarded[key]
        if theirs is None or not math.isfinite(guard.new_value):
            return False, f"{guard.metric}: {'champion' if theirs is None else 'this version'} has none, {metric} alone"
        worse = guard.new_value > theirs
        return worse, (f"{guard.metric} {guard.new_value:.6g} {'>' if worse else '<='} champion v{current}'s "
                       f"{theirs:.6g}" + (": worse than the champion" if worse else ""))

    current = _champion_version(client, name)
    for _ in range(_GATE_ROUNDS):
        wins, reason = decide(current)
        alias = CHAMPION if wins else CHALLENGER
        evidence = {
            "gate.metric": metric,
            "gate.value": repr(float(new_value)),
            "gate.champion_version": current or "",
            "gate.champion_value": "" if compared.get(current or "") is None else repr(compared[current or ""]),
            "gate.decision": alias,
            "gate.reason": reason,
            **{f"gate.{g.metric}.{k}": "" if v is None else repr(float(v))
               for g in guards for k, v in (("value", g.new_value),
                                            ("champion_value", guarded.get((current or "", g.metric))))},
        }
        for key, value in evidence.items():
            client.set_model_version_tag(name, version, key, value)
        latest = _champion_version(client, name)  # the comparison took seconds: did the champion move?
        if latest != current:
            current = latest
            continue
        client.set_registered_model_alias(name, alias, version)
        if not wins:
            break
        time.sleep(GATE_SETTLE_S)
        latest = _champion_version(client, name)
        if latest == version:
            break
        current = latest  # another run moved it between our read and our write: compare with it
    else:
        raise RegistryError(f"{name} v{version}: the champion kept moving under {_GATE_ROUNDS} comparisons in "
                            f"{stores} (runs registering at once); rerun to compare again")
    champ_value = compared.get(current or "")
    run_id = client.get_model_version(name, version).run_id
    if run_id:
        from mlflow.entities import Metric, RunTag

        metrics = mlflow_metrics({f"gate_new_{metric}": new_value, f"gate_champion_{metric}": champ_value,
                                  **{f"gate_{side}_{g.metric}": value for g in guards for side, value in
                                     (("new", g.new_value), ("champion", guarded.get((current or "", g.metric))))}})
        tags = {**evidence, "registered_name": name, "registered_version": version, "alias": alias}
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, _now_ms(), 0) for k, v in metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
    guard_values = {g.metric: (float(g.new_value), guarded.get((current or "", g.metric))) for g in guards}
    return Promotion(name, version, alias, metric, float(new_value), current, champ_value, reason, guard_values)


def _champion_version(client: MlflowClient, name: str) -> str | None:
    """The version `champion` points at; None where the store answered that there is none (any other failure,
    a server that is down included, is raised: never taken for "no champion")."""
    from mlflow.exceptions import MlflowException  # heavy: only when registering

    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException as err:
        code, text = str(err.error_code), str(err.message).lower()
        if code in NOT_FOUND_CODES or (code == "INVALID_PARAMETER_VALUE" and "not found" in text):
            return None
        raise


def _now_ms() -> int:
    return int(time.time() * 1000)
