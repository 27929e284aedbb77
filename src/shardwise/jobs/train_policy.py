"""`shardwise train-policy`: train a DreamShard or AutoShard placement policy against a cost model; register it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from shardwise.extras import require
from shardwise.integrations.mlflow import MlflowService, RegistryError
from shardwise.search import (
    PlanError,
    get_method,
    make_searcher,
    mean_plan_cost,
    method_names,
    sample_training_tasks,
)
from shardwise.workload import load_tables

from .base import JobResult, JobSettings, SettingsError
from .models import load_cost_model


def policy_methods() -> tuple[str, ...]:
    """The registered methods that plan with a trained policy."""
    return tuple(name for name in method_names() if get_method(name).policy is not None)


class TrainPolicySettings(JobSettings):
    """The method, the cost model it learns against, the tasks it trains and is validated on."""

    method: str = Field(description="a method that plans with a trained policy")
    model: str = Field(description="cost model: directory, models:/<name>@<alias> or runs:/...")
    tables: str = Field(description="shardwise.tables/v1 file to sample training tasks from")
    out: str = Field(description="directory for policy/ and history.json")
    num_tasks: int = Field(default=40, ge=1, description="training tasks")
    validation_tasks: int = Field(default=8, ge=1, description="tasks that decide the registry alias")
    min_tables: int = Field(default=20, ge=1, description="fewest tables in a sampled task")
    max_tables: int = Field(default=60, ge=1, description="most tables in a sampled task")
    num_devices: int = Field(default=4, ge=1, description="devices of every sampled task")
    memory_slack: float = Field(default=1.5, gt=0, description="memory per device = slack x total memory / devices")
    episodes: int = Field(default=200, ge=1, description="batches of rollouts to train on")
    seed: int = 0
    tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)"
    )
    no_register: bool = Field(default=False, description="log the run but do not register the policy")

    @field_validator("method")
    @classmethod
    def _trainable(cls, method: str) -> str:
        if get_method(method).policy is None:
            raise ValueError(f"{method!r} plans without a trained policy; one of {', '.join(policy_methods())}")
        return method


class TrainPolicyResult(JobResult):
    """The trained policy, its validation cost and where the registry put it."""

    method: str
    out: str
    validation_cost: float
    validation_tasks: int
    run_id: str | None = None
    registered_name: str | None = None
    registered_version: str | None = None
    alias: str | None = None
    champion_cost: float | None = None

    def summary(self) -> str:
        """Validation cost, files, registry outcome."""
        lines = [f"{self.method}: validation plan cost {self.validation_cost:.4f} x (sum of table costs / devices) "
                 f"on {self.validation_tasks} tasks; wrote {self.out}"]
        if self.registered_name:
            lines.append(
                f"registered {self.registered_name} version {self.registered_version} as @{self.alias}"
                + (f" (champion's validation cost {self.champion_cost:.4f})" if self.champion_cost is not None else "")
            )
        return "\n".join(lines)


def run(settings: TrainPolicySettings, *, mlflow: MlflowService | None = None) -> TrainPolicyResult:
    """Train on sampled tasks, validate on tasks of another seed, log; the gate decides on `champion`."""
    if mlflow is None:
        require("mlflow")  # said before training, not after
    service = mlflow or MlflowService(settings.tracking_uri)
    cost_model, _ = load_cost_model(service, settings.model, device="cpu", required=True)
    assert cost_model is not None
    shape: dict[str, Any] = {"min_tables": settings.min_tables, "max_tables": settings.max_tables,
             "num_devices": settings.num_devices, "memory_slack": settings.memory_slack}
    tables = load_tables(settings.tables)
    try:
        tasks = sample_training_tasks(tables, settings.num_tasks, settings.seed, **shape)
        # validation tasks come from another seed: the alias goes to the policy that plans them best
        validation = sample_training_tasks(tables, settings.validation_tasks, settings.seed + 1, **shape)
    except ValueError as err:
        raise SettingsError(f"--tables {settings.tables}: {err}") from None
    hooks = get_method(settings.method).policy
    assert hooks is not None
    policy, history = hooks.train(cost_model, tasks, settings.seed, episodes=settings.episodes, device=None,
                                  progress=True)
    out = Path(settings.out)
    policy_dir = out / "policy"
    policy.save(policy_dir)
    (out / "history.json").write_text(json.dumps(history, indent=1))
    cost = mean_plan_cost(make_searcher(settings.method, policy=str(policy_dir)), validation, cost_model)
    result: dict[str, Any] = dict(method=settings.method, out=str(policy_dir), validation_cost=cost, validation_tasks=len(validation))

    def champion_cost(uri: str) -> float | None:
        # the champion planned the same validation tasks; one that cannot (unreadable, other shape) yields
        try:
            return service.load(uri, lambda d: mean_plan_cost(make_searcher(settings.method, policy=str(d)),
                                                               validation, cost_model))
        except (RegistryError, PlanError, OSError, ValueError):
            return None

    logged = service.log_policy(
        policy_dir, method=settings.method, hardware_kind=cost_model.hardware_kind, history=history,
        params={**settings.model_dump(mode="json", exclude={"tracking_uri", "no_register", "out"})},
        validation_cost=cost, register=not settings.no_register, champion_value=champion_cost,
    )
    promo = logged.promotion
    if promo is not None:
        result.update(registered_name=promo.name, registered_version=promo.version, alias=promo.alias,
                      champion_cost=promo.champion_value)
    return TrainPolicyResult(**result, run_id=logged.run_id)
