"""DreamShard: a placement policy trained by REINFORCE on an estimated MDP.

A cost network (per-table MLP, sum per device, forward / backward / all-to-all heads, max over devices)
stands in for the hardware: it is fitted to the shardwise `CostModel`'s per-device predictions for plans,
and refreshed with the plans the policy produces as it improves (the "measurements" here are the CostModel's
simulated costs, not hardware runs). The policy places tables one at a time in descending predicted cost,
scoring each device from its tables' summed embedding and the cost network's costs before and after placing
the table; devices without room are masked. Sums over tables and a max over devices make the networks
independent of the number of tables and devices, so one policy plans any task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from shardwise.costmodel.networks import load_checked_state
from shardwise.costmodel.types import CostModel
from shardwise.workload import NUM_FEATURES, ShardingTask

from .placement import (
    PlacementTask,
    assignment_costs_ms,
    legal_devices,
    masked_logits,
    prepare_task,
    select_device,
)
from .plan import PlanError
from .policy_files import checked_policy, read_policy, save_policy
from .registry import PolicyHooks
from .threads import single_thread

METHOD = "dreamshard"
#: cost features per device: current fwd/bwd/comm, after placing the table, plan cost after, plan cost now,
#: memory used now and after (fractions of capacity), placement progress, and two in units of the table's own
#: cost: how much the plan cost grows, and how much more this device ends up costing than the cheapest choice
NUM_COST_FEATURES = 13
_MIN_LOG_MS = -9.0


@dataclass(frozen=True)
class DreamShardConfig:
    """Network sizes and the training schedule."""

    hidden: int = 64
    iterations: int = 8  # alternations: refresh the cost network, then train the policy on it
    episodes_per_iteration: int = 25
    rollouts: int = 16  # parallel rollouts of one task per episode; their mean reward is the baseline
    cost_steps: int = 150  # cost-network gradient steps per refresh
    initial_random_plans: int = 48  # per task, to fit the first cost network
    measured_plans: int = 4  # policy plans per episode costed by the CostModel for the next refresh
    max_plans_per_task: int = 256
    lr_policy: float = 2e-3
    lr_cost: float = 3e-3
    entropy_weight: float = 0.01
    infeasible_penalty: float = 3.0  # reward (in units of the task's scale) for a rollout that ran out of memory


def _mlp(in_features: int, hidden: int, out_features: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out_features)
    )


class CostNetwork(nn.Module):
    """Per-table MLP, summed per device, then forward / backward / all-to-all heads -> per-device log ms."""

    def __init__(self, num_features: int, hidden: int) -> None:
        super().__init__()
        self.table = _mlp(num_features, hidden, hidden)
        self.fwd = _mlp(hidden + 1, hidden, 1)
        self.bwd = _mlp(hidden + 1, hidden, 1)
        # all-to-all depends on the whole layout: the device's sum, the mean over devices, its and the max width
        self.comm = _mlp(2 * hidden + 3, hidden, 1)

    def log_ms(self, summed: torch.Tensor, widths: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """[..., D, H] summed table embeddings, [..., D] widths and table counts -> [..., D, 3] log ms."""
        count = torch.log1p(counts).unsqueeze(-1)
        width = torch.log1p(widths).unsqueeze(-1) / 8.0
        max_width = width.amax(dim=-2, keepdim=True).expand_as(width)
        context = summed.mean(dim=-2, keepdim=True).expand_as(summed)
        out = torch.cat(
            [
                self.fwd(torch.cat([summed, count], -1)),
                self.bwd(torch.cat([summed, count], -1)),
                self.comm(torch.cat([summed, context, width, max_width, count], -1)),
            ],
            dim=-1,
        )
        return out.clamp(_MIN_LOG_MS, 12.0)

    def ms(self, summed: torch.Tensor, widths: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Per-device [..., D, 3] fwd, bwd, all-to-all ms (an empty device computes nothing)."""
        ms = torch.exp(self.log_ms(summed, widths, counts))
        compute_mask = torch.stack([counts > 0, counts > 0, torch.ones_like(counts, dtype=torch.bool)], dim=-1)
        return ms * compute_mask


class PolicyNetwork(nn.Module):
    """Scores each device for the next table from the device's summed table embeddings and its cost features."""

    def __init__(self, num_features: int, hidden: int) -> None:
        super().__init__()
        self.table = _mlp(num_features, hidden, hidden)
        self.score = _mlp(2 * hidden + NUM_COST_FEATURES, hidden, 1)

    def logits(self, device_sums: torch.Tensor, table: torch.Tensor, cost_features: torch.Tensor) -> torch.Tensor:
        """[K, D, H] device sums, [H] next table, [K, D, C] cost features -> [K, D] logits."""
        table = table.expand_as(device_sums)
        return self.score(torch.cat([device_sums, table, cost_features], dim=-1)).squeeze(-1)


@dataclass
class _Rollouts:
    assignments: torch.Tensor  # [K, T] device per table (placement order)
    log_prob: torch.Tensor  # [K] sum over steps
    entropy: torch.Tensor  # [K] mean over steps
    feasible: torch.Tensor  # [K] bool
    estimated_cost: torch.Tensor  # [K] plan cost from the cost network, in units of the task's scale


class DreamShardPolicy:
    """A trained DreamShard policy and the cost network that produces its state features.

    The cost network reads each table's policy features and the CostModel's table embedding (width
    `cost_embedding_dim`), so a policy plans with cost models of that embedding width (its own, normally)."""

    method = METHOD

    def __init__(self, config: DreamShardConfig, cost_embedding_dim: int, cost_net: CostNetwork | None = None,
                 policy_net: PolicyNetwork | None = None, provenance: dict[str, Any] | None = None) -> None:
        self.config = config
        self.cost_embedding_dim = cost_embedding_dim
        self.cost_net = cost_net or CostNetwork(NUM_FEATURES + cost_embedding_dim, config.hidden)
        self.policy_net = policy_net or PolicyNetwork(NUM_FEATURES, config.hidden)
        self.provenance = dict(provenance or {})
        self.device = torch.device("cpu")

    def cost_inputs(self, prepared: PlacementTask) -> torch.Tensor:
        """[T, 21 + H] cost-network inputs: policy features and the CostModel's table embeddings."""
        if prepared.embeddings.shape[1] != self.cost_embedding_dim:
            raise PlanError(
                f"dreamshard policy was trained with cost-model embeddings of width {self.cost_embedding_dim}, "
                f"this cost model gives {prepared.embeddings.shape[1]} (use the cost model the policy was trained with)"
            )
        x = np.concatenate([prepared.features, prepared.embeddings], axis=1)
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)

    def to(self, device: str | torch.device) -> DreamShardPolicy:
        """Move both networks to `device`."""
        self.device = torch.device(device)
        self.cost_net.to(self.device)
        self.policy_net.to(self.device)
        return self

    def rollout(self, prepared: PlacementTask, rollouts: int, greedy: bool,
                generator: torch.Generator | None = None) -> _Rollouts:
        """Place the task's tables `rollouts` times (argmax or sampled), states from the cost network."""
        dev = self.device
        k, d, t_count = rollouts, prepared.num_devices, prepared.num_tables
        x = torch.as_tensor(prepared.features, device=dev)
        policy_emb = self.policy_net.table(x)
        with torch.no_grad():
            cost_emb = self.cost_net.table(self.cost_inputs(prepared))
        dims = torch.as_tensor(prepared.dims, dtype=torch.float32, device=dev)
        memory = torch.as_tensor(prepared.memory_bytes, dtype=torch.float64, device=dev)
        capacity = float(prepared.capacity_bytes)
        scale = prepared.scale_ms
        eye = torch.eye(d, device=dev)
        arange_k = torch.arange(k, device=dev)

        policy_sums = torch.zeros(k, d, policy_emb.shape[1], device=dev)
        cost_sums = torch.zeros(k, d, cost_emb.shape[1], device=dev)
        widths = torch.zeros(k, d, device=dev)
        counts = torch.zeros(k, d, device=dev)
        used = torch.zeros(k, d, dtype=torch.float64, device=dev)
        with torch.no_grad():
            current = self.cost_net.ms(cost_sums, widths, counts) / scale  # [K, D, 3]
        actions, log_probs, entropies = [], [], []
        feasible = torch.ones(k, dtype=torch.bool, device=dev)
        for t in range(t_count):
            with torch.no_grad():
                # candidate layouts: the table added to each device in turn -> [K, Dc, D, ...]
                cand_sums = cost_sums.unsqueeze(1) + eye[None, :, :, None] * cost_emb[t]
                cand_widths = widths.unsqueeze(1) + eye[None] * dims[t]
                cand_counts = counts.unsqueeze(1) + eye[None]
                cand = self.cost_net.ms(cand_sums, cand_widths, cand_counts) / scale  # [K, Dc, D, 3]
                after_self = cand.diagonal(dim1=1, dim2=2).transpose(1, 2)  # [K, D, 3]
                plan_after = cand.sum(-1).amax(-1)  # [K, Dc]
                plan_now = current.sum(-1).amax(-1, keepdim=True).expand(k, d)
                used_after = used + memory[t]
                legal = torch.as_tensor(legal_devices(prepared, used.cpu().numpy(), t), device=dev)
                progress = torch.full((k, d), t / t_count, device=dev)
                # comparisons between devices in units of the table's cost keep small tables' choices legible
                unit = max(float(prepared.table_cost_ms[t]) / scale, 1e-6)
                self_total = after_self.sum(-1)
                features = torch.cat(
                    [current, after_self, plan_after[..., None], plan_now[..., None],
                     (used / capacity).float()[..., None], (used_after / capacity).float()[..., None],
                     progress[..., None], ((plan_after - plan_now) / unit).clamp(-10, 10)[..., None],
                     ((self_total - self_total.amin(-1, keepdim=True)) / unit).clamp(0, 10)[..., None]],
                    dim=-1,
                )
            logits = masked_logits(self.policy_net.logits(policy_sums, policy_emb[t], features), legal)
            dist = torch.distributions.Categorical(logits=logits)
            if greedy:
                action = logits.argmax(dim=-1)
            else:
                # sample on the CPU generator so seeded runs agree across devices
                probs = dist.probs.detach().cpu()
                action = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(dev)
            feasible &= legal[arange_k, action]
            actions.append(action)
            log_probs.append(dist.log_prob(action))
            entropies.append(dist.entropy())
            onehot = torch.nn.functional.one_hot(action, d).float()
            policy_sums = policy_sums + onehot[..., None] * policy_emb[t]
            cost_sums = cost_sums + onehot[..., None] * cost_emb[t]
            widths = widths + onehot * dims[t]
            counts = counts + onehot
            used = used + onehot.double() * memory[t]
            current = cand[arange_k, action]
        return _Rollouts(
            assignments=torch.stack(actions, dim=1),
            log_prob=torch.stack(log_probs, dim=1).sum(dim=1),
            entropy=torch.stack(entropies, dim=1).mean(dim=1),
            feasible=feasible,
            estimated_cost=current.sum(-1).amax(-1),
        )

    @torch.no_grad()
    def candidates(
        self, cost_model: CostModel, prepared: PlacementTask, samples: int, seed: int
    ) -> list[np.ndarray]:
        """The greedy placement, then `samples` sampled ones (seeded), as device-per-table arrays."""
        self.cost_net.eval()
        self.policy_net.eval()
        out = [self.rollout(prepared, 1, greedy=True).assignments[0].cpu().numpy()]
        if samples > 0:
            generator = torch.Generator().manual_seed(seed)
            sampled = self.rollout(prepared, samples, greedy=False, generator=generator).assignments
            out += list(sampled.cpu().numpy())
        return out

    def save(self, directory: str | Path) -> Path:
        """Write the policy (state_dict + JSON config) to `directory`."""
        state = {f"cost.{k}": v for k, v in self.cost_net.state_dict().items()}
        state |= {f"policy.{k}": v for k, v in self.policy_net.state_dict().items()}
        config = {**asdict(self.config), "cost_embedding_dim": self.cost_embedding_dim}
        return save_policy(directory, METHOD, config, state, self.provenance)

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> DreamShardPolicy:
        """Read a policy written by `save`."""
        config_doc, state, provenance = read_policy(directory, METHOD)
        with checked_policy(directory):
            embedding_dim = int(config_doc.pop("cost_embedding_dim"))
            policy = cls(DreamShardConfig(**config_doc), embedding_dim, provenance=provenance)
            load_checked_state(policy.cost_net, state, "cost.")
            load_checked_state(policy.policy_net, state, "policy.")
        return policy.to(device)



# -- training ----------------------------------------------------------------------------------------------
class _PlanData:
    """Plans of each task with their per-device CostModel costs: the cost network's training set."""

    def __init__(self, prepared: Sequence[PlacementTask], max_per_task: int) -> None:
        self.prepared = prepared
        self.max_per_task = max_per_task
        self.assignments: list[list[np.ndarray]] = [[] for _ in prepared]
        self.costs_ms: list[list[np.ndarray]] = [[] for _ in prepared]

    def add(self, cost_model: CostModel, index: int, assignments: np.ndarray) -> np.ndarray:
        """Cost `assignments` [N, T] with the CostModel (the 'measurement'), keep them, return [N, D, 3]."""
        costs = assignment_costs_ms(cost_model, self.prepared[index], assignments)
        self.assignments[index] += list(assignments)
        self.costs_ms[index] += list(costs)
        del self.assignments[index][: -self.max_per_task]
        del self.costs_ms[index][: -self.max_per_task]
        return costs


def _fit_cost_net(policy: DreamShardPolicy, optimizer: torch.optim.Optimizer, data: _PlanData, steps: int,
                  rng: np.random.Generator, device: torch.device, batch: int = 64) -> float:
    """A few Adam steps of log-ms regression on random tasks' plans; returns the last loss."""
    net = policy.cost_net
    net.train()
    loss_value = float("nan")
    for _ in range(steps):
        i = int(rng.integers(len(data.prepared)))
        prepared = data.prepared[i]
        pick = rng.choice(len(data.assignments[i]), size=min(batch, len(data.assignments[i])), replace=False)
        assign = torch.as_tensor(np.stack([data.assignments[i][j] for j in pick]), device=device)
        target = torch.as_tensor(np.stack([data.costs_ms[i][j] for j in pick]), dtype=torch.float32, device=device)
        onehot = torch.nn.functional.one_hot(assign, prepared.num_devices).float()  # [N, T, D]
        emb = net.table(policy.cost_inputs(prepared))
        summed = torch.einsum("ntd,th->ndh", onehot, emb)
        widths = torch.einsum("ntd,t->nd", onehot, torch.as_tensor(prepared.dims, dtype=torch.float32, device=device))
        counts = onehot.sum(dim=1)
        pred = net.log_ms(summed, widths, counts)
        valid = torch.stack([counts > 0, counts > 0, torch.ones_like(counts, dtype=torch.bool)], dim=-1)
        target_log = torch.log(target.clamp_min(np.exp(_MIN_LOG_MS)))
        loss = ((pred - target_log) ** 2)[valid].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = float(loss.detach())
    net.eval()
    return loss_value


def _random_assignments(prepared: PlacementTask, count: int, rng: np.random.Generator) -> np.ndarray:
    """[count, T] random placements with skewed device shares (Dirichlet), so loads span light to heavy."""
    shares = rng.dirichlet(np.ones(prepared.num_devices), size=count)
    cumulative = shares.cumsum(axis=1)
    draws = rng.random((count, prepared.num_tables, 1))
    return np.minimum((draws > cumulative[:, None, :]).sum(axis=2), prepared.num_devices - 1)


def _train_dreamshard(
    cost_model: CostModel,
    tasks: Sequence[ShardingTask],
    seed: int,
    config: DreamShardConfig | None = None,
    *,
    device: str | None = None,
    progress: bool = True,
) -> tuple[DreamShardPolicy, list[dict[str, float]]]:
    """Train a DreamShard policy on `tasks` against `cost_model`; returns it and per-iteration statistics."""
    if not tasks:
        raise ValueError("tasks: need at least one training task")
    config = config or DreamShardConfig()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    dev = select_device(device)
    prepared = [prepare_task(task, cost_model) for task in tasks]
    policy = DreamShardPolicy(config, prepared[0].embeddings.shape[1]).to(dev)
    data = _PlanData(prepared, config.max_plans_per_task)
    for i, p in enumerate(prepared):
        data.add(cost_model, i, _random_assignments(p, config.initial_random_plans, rng))
    cost_opt = torch.optim.Adam(policy.cost_net.parameters(), lr=config.lr_cost)
    policy_opt = torch.optim.Adam(policy.policy_net.parameters(), lr=config.lr_policy)
    history: list[dict[str, float]] = []
    from tqdm.auto import tqdm  # training only: planning with a trained policy shows no bar

    bar = tqdm(total=config.iterations * config.episodes_per_iteration, desc="dreamshard", disable=not progress)
    for iteration in range(config.iterations):
        cost_loss = _fit_cost_net(policy, cost_opt, data, config.cost_steps, rng, dev)
        policy.policy_net.train()
        estimated, measured, feasible_frac = [], [], []
        for _ in range(config.episodes_per_iteration):
            i = int(rng.integers(len(prepared)))
            out = policy.rollout(prepared[i], config.rollouts, greedy=False, generator=generator)
            reward = torch.where(out.feasible, -out.estimated_cost, torch.full_like(out.estimated_cost,
                                                                                 -config.infeasible_penalty))
            advantage = (reward - reward.mean()).detach()
            loss = -(advantage * out.log_prob).mean() - config.entropy_weight * out.entropy.mean()
            policy_opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(policy.policy_net.parameters(), 1.0)
            policy_opt.step()
            # "measure" some of the plans the policy produced: the CostModel's costs refresh the cost network
            keep = out.assignments[out.feasible][: config.measured_plans].cpu().numpy()
            if len(keep):
                costs = data.add(cost_model, i, keep)
                measured.append(float(costs.sum(-1).max(-1).mean()) / prepared[i].scale_ms)
            estimated.append(float(out.estimated_cost.mean()))
            feasible_frac.append(float(out.feasible.float().mean()))
            bar.update(1)
        stats = {
            "iteration": float(iteration),
            "cost_net_loss": cost_loss,
            "estimated_cost": float(np.mean(estimated)),
            "measured_cost": float(np.mean(measured)) if measured else float("nan"),
            "feasible_fraction": float(np.mean(feasible_frac)),
        }
        history.append(stats)
        bar.set_postfix(cost=f"{stats['measured_cost']:.3f}", fit=f"{cost_loss:.3f}")
    bar.close()
    policy.cost_net.eval()
    policy.policy_net.eval()
    policy.provenance = {
        "method": METHOD, "seed": seed, "num_tasks": len(tasks), "hardware_kind": cost_model.hardware_kind,
        "batch_size": cost_model.batch_size, "final_measured_cost": history[-1]["measured_cost"],
    }
    return policy, history


def train_dreamshard(
    cost_model: CostModel,
    tasks: Sequence[ShardingTask],
    seed: int,
    config: DreamShardConfig | None = None,
    *,
    device: str | None = None,
    progress: bool = True,
) -> tuple[DreamShardPolicy, list[dict[str, float]]]:
    """Train a DreamShard policy on `tasks` against `cost_model`; returns it and training statistics."""
    with single_thread():
        return _train_dreamshard(cost_model, tasks, seed, config, device=device, progress=progress)


def train_for_episodes(
    cost_model: CostModel,
    tasks: Sequence[ShardingTask],
    seed: int,
    *,
    episodes: int = 200,
    device: str | None = None,
    progress: bool = True,
) -> tuple[DreamShardPolicy, list[dict[str, float]]]:
    """Train with the default config for about `episodes` policy episodes (whole iterations of them)."""
    per_iteration = DreamShardConfig().episodes_per_iteration
    config = DreamShardConfig(iterations=max(1, round(episodes / per_iteration)))
    return train_dreamshard(cost_model, tasks, seed, config, device=device, progress=progress)


#: what the registry's dreamshard entry loads and trains with (registered in policy_methods.py, without torch)
HOOKS = PolicyHooks(load=DreamShardPolicy.load, train=train_for_episodes)
