"""What DreamShard and AutoShard share: a task's per-table arrays, memory masks, plan costs, plan building,
and saving a trained policy (state_dict + JSON config, no pickled modules)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from shardwise.costmodel.types import CostModel
from shardwise.workload import ShardingTask, tables_features

from .plan import Plan, PlanError, Shard, check_memory_bounds, shard_state_bytes

POLICY_FORMAT = "shardwise.policy/v1"
#: rough log-scales of dim, rows, pooling factor and size in bytes, so policy inputs are O(1)
_LOG_FEATURE_SCALE = np.array([8.0, 20.0, 6.0, 26.0])


def policy_table_features(task: ShardingTask) -> np.ndarray:
    """[T, 21] policy inputs: log-scaled dim, rows, pooling factor, size, then the 17 reuse bins."""
    raw = tables_features(task.tables, task.batch_size, task.weights_precision)
    out = raw.copy()
    out[:, :4] = np.log1p(raw[:, :4]) / _LOG_FEATURE_SCALE
    return out.astype(np.float32)


@dataclass(frozen=True)
class PlacementTask:
    """A task prepared for sequential placement: tables in placement order (descending predicted cost)."""

    task: ShardingTask
    order: np.ndarray  # [T] task table index of the t-th table placed
    features: np.ndarray  # [T, 21] policy features, in placement order
    embeddings: np.ndarray  # [T, H] the cost model's table embeddings, in placement order
    table_cost_ms: np.ndarray  # [T] predicted fwd+bwd ms of each table alone, in placement order
    memory_bytes: np.ndarray  # [T] bytes each table adds to a device, in placement order
    dims: np.ndarray  # [T] output widths, in placement order
    scale_ms: float  # sum of single-table costs / num_devices: the unit rewards and cost features use

    @property
    def num_tables(self) -> int:
        """Tables to place."""
        return int(self.order.shape[0])

    @property
    def num_devices(self) -> int:
        """Devices to place on."""
        return self.task.num_devices

    @property
    def capacity_bytes(self) -> int:
        """Memory per device."""
        return self.task.device_memory_bytes


def prepare_task(task: ShardingTask, cost_model: CostModel) -> PlacementTask:
    """Order the task's tables by predicted cost and precompute what placement needs; refuse tasks that cannot fit."""
    tables = task.tables
    check_memory_bounds(task, column_split=False)
    # memory is additive per table (state plus its share of the kernel buffers), so masks update incrementally
    memory = np.array([shard_state_bytes(t, task) for t in tables], dtype=np.int64)
    embeddings = np.asarray(cost_model.table_embeddings(tables), dtype=np.float64)
    single_ms = np.asarray(cost_model.compute_from_embeddings(embeddings)).sum(axis=1)
    # stable sort: ties keep task order, so placement is deterministic
    order = np.argsort(-single_ms, kind="stable")
    return PlacementTask(
        task=task,
        order=order,
        features=policy_table_features(task)[order],
        embeddings=embeddings[order],
        table_cost_ms=single_ms[order],
        memory_bytes=memory[order],
        dims=np.array([tables[i].dim for i in order], dtype=np.int64),
        scale_ms=max(float(single_ms.sum()) / task.num_devices, 1e-6),
    )


def layout_costs_ms(
    cost_model: CostModel, summed: np.ndarray, widths: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """Per-device [N, D, 3] fwd, bwd and all-to-all ms of N layouts, from summed embeddings [N, D, H],
    output widths [N, D] and table counts [N, D] (an empty device computes nothing)."""
    n, d, h = summed.shape
    compute = np.asarray(cost_model.compute_from_embeddings(summed.reshape(n * d, h))).reshape(n, d, 2)
    compute = np.where((counts > 0)[..., None], compute, 0.0)
    comm = np.asarray(cost_model.predict_comm(widths.astype(np.float64), compute.sum(axis=2)))
    return np.concatenate([compute, comm.sum(axis=2, keepdims=True)], axis=2)


def assignment_costs_ms(cost_model: CostModel, prepared: PlacementTask, assignments: np.ndarray) -> np.ndarray:
    """Per-device [N, D, 3] predicted costs of N assignments [N, T] (device per table, placement order)."""
    onehot = np.eye(prepared.num_devices)[assignments]  # [N, T, D]
    summed = np.einsum("ntd,th->ndh", onehot, prepared.embeddings)
    widths = np.einsum("ntd,t->nd", onehot, prepared.dims.astype(np.float64))
    return layout_costs_ms(cost_model, summed, widths, onehot.sum(axis=1))


def assignment_fits(prepared: PlacementTask, assignment: np.ndarray) -> bool:
    """Whether every device holds at most its memory."""
    used = np.bincount(assignment, weights=prepared.memory_bytes, minlength=prepared.num_devices)
    return bool((used <= prepared.capacity_bytes).all())


def best_assignment(
    cost_model: CostModel, prepared: PlacementTask, candidates: list[np.ndarray], method: str
) -> tuple[np.ndarray, float]:
    """The fitting candidate with the lowest predicted plan cost (max device ms), and that cost."""
    fitting = [a for a in candidates if assignment_fits(prepared, a)]
    if not fitting:
        raise PlanError(
            f"{method}: no placement of the {prepared.num_tables} tables fits in device_memory_bytes "
            f"{prepared.capacity_bytes} (every rollout reached a table no device had room for)"
        )
    plan_ms = assignment_costs_ms(cost_model, prepared, np.stack(fitting)).sum(axis=2).max(axis=1)
    best = int(np.argmin(plan_ms))
    return fitting[best], float(plan_ms[best])


def plan_from_assignment(prepared: PlacementTask, assignment: np.ndarray, method: str,
                         extra: Mapping[str, Any] | None = None) -> Plan:
    """A table-wise Plan from a device per table (placement order)."""
    device_of = {int(prepared.order[i]): int(assignment[i]) for i in range(prepared.num_tables)}
    shards = tuple(
        Shard(table=t.name, col_offset=0, dim=t.dim, device=device_of[i]) for i, t in enumerate(prepared.task.tables)
    )
    return Plan(num_devices=prepared.num_devices, shards=shards, method=method, extra=dict(extra or {}))


def save_policy(directory: str | Path, method: str, config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor],
                provenance: Mapping[str, Any] | None = None) -> Path:
    """Write `policy.json` (format, method, config, provenance) and `weights.pt` (a state_dict) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, directory / "weights.pt")
    doc = {"format": POLICY_FORMAT, "method": method, "config": dict(config), "provenance": dict(provenance or {})}
    (directory / "policy.json").write_text(json.dumps(doc, indent=1))
    return directory


def read_policy(directory: str | Path, method: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """(config, state_dict, provenance) of a policy saved by `save_policy`; refuses another method's policy."""
    directory = Path(directory)
    meta = directory / "policy.json"
    if not meta.exists():
        raise FileNotFoundError(f"{directory}: no policy.json (not a saved shardwise policy)")
    doc = json.loads(meta.read_text())
    if doc.get("format") != POLICY_FORMAT:
        raise ValueError(f"{meta}: field 'format' must be {POLICY_FORMAT!r}, got {doc.get('format')!r}")
    if doc.get("method") != method:
        raise ValueError(f"{meta}: field 'method' is {doc.get('method')!r}, expected {method!r}")
    state = torch.load(directory / "weights.pt", map_location="cpu", weights_only=True)
    return dict(doc["config"]), state, dict(doc.get("provenance", {}))


def read_policy_method(directory: str | Path) -> str:
    """The method ("dreamshard" or "autoshard") of a saved policy."""
    doc = json.loads((Path(directory) / "policy.json").read_text())
    return str(doc.get("method"))


def legal_devices(prepared: PlacementTask, used_bytes: np.ndarray, t: int, lookahead: int = 8) -> np.ndarray:
    """[K, D] devices that can take table t in K partial placements with `used_bytes` [K, D].

    Besides room for table t, a device must leave room for what is still to come: the remaining bytes in
    total, and the `lookahead` largest remaining tables placed worst-fit (largest first). Where that check
    rules out every device it is dropped (it is a heuristic), and plain room for table t decides."""
    capacity = float(prepared.capacity_bytes)
    k, d = used_bytes.shape
    after = used_bytes[:, None, :] + np.eye(d)[None] * float(prepared.memory_bytes[t])  # [K, Dc, D]
    fits = used_bytes + float(prepared.memory_bytes[t]) <= capacity
    remaining = prepared.memory_bytes[t + 1 :].astype(np.float64)
    if remaining.size == 0:
        return fits
    free = capacity - after
    ahead = fits & (np.clip(free, 0, None).sum(axis=2) >= remaining.sum())
    rows_k, rows_c = np.meshgrid(np.arange(k), np.arange(d), indexing="ij")
    for need in np.sort(remaining)[::-1][:lookahead]:
        roomiest = free.argmax(axis=2)
        room = free[rows_k, rows_c, roomiest]
        ahead &= room >= need
        free[rows_k, rows_c, roomiest] = room - need
    return np.where(ahead.any(axis=1, keepdims=True), ahead, fits)


def masked_logits(logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Illegal actions get -inf; rows with no legal action keep all (their episode is already lost)."""
    any_legal = legal.any(dim=-1, keepdim=True)
    keep = legal | ~any_legal
    return logits.masked_fill(~keep, float("-inf"))


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one CPU thread: the per-step networks are tiny, and fanning each small matmul out to a
    thread pool costs more than it saves (tens of times more on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def select_device(device: str | None = None) -> torch.device:
    """The torch device to run policies on: `device` if given, else CUDA when present, else CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


# -- loading by URI and the MLflow registry ------------------------------------------------------------------
POLICY_METHODS: tuple[str, ...] = ("dreamshard", "autoshard")
POLICY_ARTIFACT_PATH = "policy"
DEFAULT_POLICY_EXPERIMENT = "shardwise-policies"


def registered_policy_name(method: str, hardware_kind: str) -> str:
    """Registry name of a placement policy for one method and hardware kind."""
    return f"shardwise-policy-{method}-{hardware_kind}"


def load_policy(uri: str | Path, *, tracking_uri: str | None = None, device: str = "cpu") -> Any:
    """A trained DreamShardPolicy or AutoShardPolicy from a directory, "models:/<name>@<alias>" or "runs:/..."."""
    import tempfile

    if Path(uri).exists():
        return _load_policy_dir(Path(uri), device)
    uri = str(uri)
    if not uri.startswith(("models:/", "runs:/")) and "://" not in uri:
        raise FileNotFoundError(f"policy {uri!r}: no such directory, and not a models:/ or runs:/ URI")
    import mlflow

    from shardwise.integrations.mlflow import resolve_tracking_uri

    with tempfile.TemporaryDirectory(prefix="shardwise-policy-") as tmp:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=uri, dst_path=tmp, tracking_uri=resolve_tracking_uri(tracking_uri)
        )
        return _load_policy_dir(Path(local), device)


def _load_policy_dir(root: Path, device: str) -> Any:
    found = [root] if (root / "policy.json").is_file() else sorted(p.parent for p in root.rglob("policy.json"))
    if not found:
        raise FileNotFoundError(f"{root}: no policy.json found (not a saved shardwise policy)")
    method = read_policy_method(found[0])
    if method == "dreamshard":
        from .dreamshard import DreamShardPolicy

        return DreamShardPolicy.load(found[0], device=device)
    if method == "autoshard":
        from .autoshard import AutoShardPolicy

        return AutoShardPolicy.load(found[0], device=device)
    raise ValueError(f"{found[0] / 'policy.json'}: field 'method' is {method!r}, expected one of {POLICY_METHODS}")


class PlacementPolicy(Protocol):
    """A trained placement policy: candidate table -> device assignments for a prepared task."""

    method: str
    provenance: dict[str, Any]

    def candidates(
        self, cost_model: CostModel, prepared: PlacementTask, samples: int, seed: int
    ) -> list[np.ndarray]:
        """The greedy assignment plus `samples` sampled ones, each [T] device per table (placement order)."""
        ...


class PolicySearch:
    """Plans with a trained policy: greedy placement plus `samples` sampled rollouts, the best fitting one
    by the CostModel's predicted plan cost."""

    def __init__(self, policy: PlacementPolicy, samples: int = 0) -> None:
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        self.policy = policy
        self.samples = samples
        self.name = policy.method

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """A memory-feasible table-wise plan for `task`, or PlanError."""
        from .report import finish_plan

        if cost_model is None:
            raise PlanError(f"{self.name} needs a cost model (pass --model)")
        started = time.perf_counter()
        prepared = prepare_task(task, cost_model)
        with single_thread():
            candidates = self.policy.candidates(cost_model, prepared, self.samples, seed)
        assignment, _ = best_assignment(cost_model, prepared, candidates, self.name)
        plan = plan_from_assignment(prepared, assignment, self.name, extra={"policy": self.policy.provenance})
        return finish_plan(
            plan, task, cost_model, planning_time_s=time.perf_counter() - started, seed=seed,
            options={"samples": self.samples, "candidates": len(candidates)},
        )


def policy_searcher(method: str, *, policy: Any = None, samples: int = 0, tracking_uri: str | None = None) -> Any:
    """The PolicySearch for `policy` (a loaded policy, a directory or a registry URI)."""
    if method not in POLICY_METHODS:
        raise ValueError(f"method {method!r} is not one of {POLICY_METHODS}")
    if policy is None:
        return _RegisteredPolicySearch(method, samples, tracking_uri)
    if isinstance(policy, (str, Path)):
        policy = load_policy(policy, tracking_uri=tracking_uri)
    if getattr(policy, "method", None) != method:
        raise ValueError(f"policy is a {getattr(policy, 'method', type(policy).__name__)} policy, not {method}")
    return PolicySearch(policy, samples=samples)


class _RegisteredPolicySearch:
    """Without an explicit policy: the registry's `champion` for the method and the cost model's hardware kind."""

    def __init__(self, method: str, samples: int, tracking_uri: str | None) -> None:
        self.name, self.samples, self.tracking_uri = method, samples, tracking_uri

    def search(self, task: ShardingTask, cost_model: CostModel | None, seed: int) -> Plan:
        """Load the champion policy for `cost_model.hardware_kind`, then plan with it."""
        if cost_model is None:
            raise PlanError(f"{self.name} needs a cost model (pass --model)")
        uri = f"models:/{registered_policy_name(self.name, cost_model.hardware_kind)}@champion"
        try:
            policy = load_policy(uri, tracking_uri=self.tracking_uri)
        except Exception as err:  # whatever MLflow raised: say what to do
            raise PlanError(
                f"{self.name}: no trained policy at {uri} ({type(err).__name__}); train one with "
                f"`shardwise train-policy --method {self.name} ...` or pass --policy DIR"
            ) from None
        searcher = policy_searcher(self.name, policy=policy, samples=self.samples)
        return searcher.search(task, cost_model, seed)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LoggedPolicy:
    """Where a trained policy went: its run, registry name and version, and the alias it received."""

    run_id: str
    name: str | None
    version: str | None
    alias: str | None


def log_policy(
    policy: Any,
    history: list[dict[str, float]],
    *,
    params: Mapping[str, Any],
    validation_cost: float,
    tracking_uri: str | None = None,
    register: bool = True,
    champion_cost: float | None = None,
) -> LoggedPolicy:
    """Log a trained policy (params, training curve, files) to MLflow; register it and set `champion` when its
    mean validation plan cost beats the current champion's on the same tasks (`champion_cost`), else
    `challenger`."""
    import tempfile

    import mlflow

    from shardwise.integrations.mlflow import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment(DEFAULT_POLICY_EXPERIMENT)
    method = policy.method
    hardware_kind = str(policy.provenance.get("hardware_kind", "unknown"))
    with tempfile.TemporaryDirectory(prefix="shardwise-policy-") as tmp, mlflow.start_run(
        run_name=f"train-{method}"
    ) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        for step, row in enumerate(history):
            mlflow.log_metrics({k: v for k, v in row.items() if np.isfinite(v)}, step=step)
        mlflow.log_metric("validation_cost", validation_cost)
        policy.save(Path(tmp) / POLICY_ARTIFACT_PATH)
        mlflow.log_artifacts(str(Path(tmp) / POLICY_ARTIFACT_PATH), POLICY_ARTIFACT_PATH)
        if not register:
            return LoggedPolicy(run.info.run_id, None, None, None)
        client = mlflow.MlflowClient()
        name = registered_policy_name(method, hardware_kind)
        try:
            client.get_registered_model(name)
        except mlflow.exceptions.MlflowException:
            client.create_registered_model(name, description=f"shardwise {method} placement policy for {hardware_kind}")
        version = client.create_model_version(
            name, source=f"{run.info.artifact_uri}/{POLICY_ARTIFACT_PATH}", run_id=run.info.run_id
        ).version
        alias = "champion" if champion_cost is None or validation_cost < champion_cost else "challenger"
        client.set_registered_model_alias(name, alias, str(version))
        mlflow.set_tags({"registered_version": str(version), "alias": alias})
        return LoggedPolicy(run.info.run_id, name, str(version), alias)


def mean_plan_cost(searcher: Any, tasks: list[ShardingTask], cost_model: CostModel) -> float:
    """Mean predicted plan cost over `tasks`, each in units of its scale (sum of table costs / devices)."""
    costs = []
    for seed, task in enumerate(tasks):
        plan = searcher.search(task, cost_model, seed)
        costs.append(float(plan.extra["predicted"]["max_cost_ms"]) / prepare_task(task, cost_model).scale_ms)
    return float(np.mean(costs))


# -- training entry point shared by the CLI and the benchmark --------------------------------------------------
def sample_training_tasks(tableset: Any, num_tasks: int, seed: int, *, min_tables: int = 20, max_tables: int = 60,
                          num_devices: int = 4, memory_slack: float = 1.5) -> list[ShardingTask]:
    """`num_tasks` tasks of `min_tables`..`max_tables` tables from `tableset` (a TableSet), seeded."""
    from shardwise.workload.tableset import sample_task

    if num_tasks < 1:
        raise ValueError(f"num_tasks {num_tasks} must be >= 1")
    if not 1 <= min_tables <= max_tables:
        raise ValueError(f"need 1 <= min_tables ({min_tables}) <= max_tables ({max_tables})")
    max_tables = min(max_tables, len(tableset.tables))
    min_tables = min(min_tables, max_tables)
    rng = np.random.default_rng(seed)
    return [
        sample_task(tableset, int(rng.integers(min_tables, max_tables + 1)), num_devices,
                    seed=int(rng.integers(2**31)), memory_slack=memory_slack)
        for _ in range(num_tasks)
    ]


def train_policy(method: str, cost_model: CostModel, tasks: list[ShardingTask], seed: int, *, episodes: int = 200,
                 device: str | None = None, progress: bool = True) -> tuple[Any, list[dict[str, float]]]:
    """Train a `method` policy for about `episodes` batches of rollouts; returns (policy, history)."""
    if method == "dreamshard":
        from .dreamshard import DreamShardConfig, train_dreamshard

        per_iteration = DreamShardConfig().episodes_per_iteration
        config = DreamShardConfig(iterations=max(1, round(episodes / per_iteration)))
        return train_dreamshard(cost_model, tasks, seed, config, device=device, progress=progress)
    if method == "autoshard":
        from .autoshard import AutoShardConfig, train_autoshard

        return train_autoshard(cost_model, tasks, seed, AutoShardConfig(episodes=episodes), device=device,
                               progress=progress)
    raise ValueError(f"method {method!r} is not one of {POLICY_METHODS}")
