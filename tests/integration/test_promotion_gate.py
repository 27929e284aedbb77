"""The promotion gate's guard on a real MLflow registry (a sqlite store): a version that wins on its metric but is
worse than the champion on a guard metric (a cost model's MAPE over the costliest tenth of the held-out shards)
stays a challenger, the reason naming that metric; a champion without the guard's figure is compared on the
metric alone."""

from __future__ import annotations

import pytest

from shardwise.integrations.mlflow import (
    CHALLENGER,
    CHAMPION,
    COST_MODEL_GUARD_METRIC,
    COST_MODEL_METRIC,
    MlflowService,
)
from shardwise.integrations.promotion import Guard

pytestmark = pytest.mark.integration

NAME = "shardwise-cost-gate-test"


@pytest.fixture
def service(tmp_path, monkeypatch, new_store):
    monkeypatch.chdir(tmp_path)
    return MlflowService(new_store(tmp_path / "mlflow.db"))


def _version(service: MlflowService, tmp_path) -> str:
    source = tmp_path / "artifacts"
    source.mkdir(exist_ok=True)
    return service.register_version(NAME, str(source), "", description="gate test")


def _gate(service: MlflowService, version: str, mape: float, top: float, champion: dict[str, tuple[float, float | None]]):
    """`version` through the gate with MAPE `mape` and top-decile MAPE `top`; `champion` maps a version to its two."""

    def value(index: int):
        return lambda uri: champion[uri.rsplit("/", 1)[1]][index]

    return service.promote(NAME, version, metric=COST_MODEL_METRIC, new_value=mape, champion_value=value(0),
                           guards=(Guard(COST_MODEL_GUARD_METRIC, top, value(1)),))


def test_a_challenger_better_overall_but_worse_on_the_costliest_shards_is_refused(service, tmp_path):
    figures: dict[str, tuple[float, float | None]] = {}
    first = _version(service, tmp_path)
    assert _gate(service, first, 6.0, 9.0, figures).alias == CHAMPION
    figures[first] = (6.0, 9.0)

    worse_on_top = _version(service, tmp_path)
    refused = _gate(service, worse_on_top, 5.0, 11.0, figures)
    assert refused.alias == CHALLENGER and refused.champion_version == first
    assert COST_MODEL_GUARD_METRIC in refused.reason and "worse" in refused.reason
    assert refused.guard_values == {COST_MODEL_GUARD_METRIC: (11.0, 9.0)}
    client = service._client()
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == first
    tags = client.get_model_version(NAME, worse_on_top).tags
    assert tags["gate.decision"] == CHALLENGER and COST_MODEL_GUARD_METRIC in tags["gate.reason"]
    assert float(tags[f"gate.{COST_MODEL_GUARD_METRIC}.value"]) == 11.0
    assert float(tags[f"gate.{COST_MODEL_GUARD_METRIC}.champion_value"]) == 9.0

    better_on_both = _version(service, tmp_path)
    assert _gate(service, better_on_both, 5.0, 9.0, figures).alias == CHAMPION  # no worse (equal) is enough
    assert str(client.get_model_version_by_alias(NAME, CHAMPION).version) == better_on_both


def test_a_champion_without_the_guard_figure_is_compared_on_the_metric_alone(service, tmp_path):
    figures: dict[str, tuple[float, float | None]] = {}
    old = _version(service, tmp_path)
    _gate(service, old, 6.0, float("nan"), figures)
    figures[old] = (6.0, None)  # an older model: no top-decile figure
    new = _version(service, tmp_path)
    promoted = _gate(service, new, 5.0, 30.0, figures)
    assert promoted.alias == CHAMPION and promoted.guard_values == {COST_MODEL_GUARD_METRIC: (30.0, None)}
    assert f"{COST_MODEL_GUARD_METRIC}: champion has none, {COST_MODEL_METRIC} alone" in promoted.reason
