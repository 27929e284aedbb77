"""AutoShard: a recurrent placement policy trained with advantage actor-critic against the CostModel.

Tables are placed one at a time in descending predicted cost. A GRU carries the placement so far (its input:
the current table's features, progress, and the devices' cost and memory summary); each device is scored from
the GRU state and its action features: the CostModel's predicted cost of the device and of the whole plan if
the table goes there (via `table_embeddings` + `compute_from_embeddings` and `predict_comm`), and its memory.
The reward is the negative growth of the predicted plan cost at each step (it sums to minus the final max
device cost), and a critic on the same state gives the baseline (advantage = return - value). Unlike the
original AutoShard, devices without room for the table are masked, and a plan that does not fit is never
returned.
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

from .placement import PlacementTask, legal_devices, masked_logits, prepare_task, select_device
from .policy_files import checked_policy, read_policy, save_policy
from .registry import PolicyHooks
from .threads import single_thread

METHOD = "autoshard"
#: per-device action features: compute now, total now, total after placing, plan cost after, plan cost now,
#: memory used now and after, width share, and plan-cost growth and device excess in units of the table's cost
NUM_DEVICE_FEATURES = 10


@dataclass(frozen=True)
class AutoShardConfig:
    """Network sizes and the training schedule."""

    hidden: int = 64
    episodes: int = 200
    rollouts: int = 16  # parallel rollouts of one task per episode
    lr: float = 2e-3
    entropy_weight: float = 0.01
    value_weight: float = 0.5
    shaped_reward: bool = True  # per-step growth of the plan cost; False: only minus the final cost
    infeasible_penalty: float = 3.0  # reward (in units of the task's scale) when no device has room


def _mlp(in_features: int, hidden: int, out_features: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))


class AutoShardNetwork(nn.Module):
    """GRU over placement steps, a per-device actor and a critic on the pooled state."""

    def __init__(self, num_features: int, hidden: int) -> None:
        super().__init__()
        self.table = _mlp(num_features, hidden, hidden)
        self.gru = nn.GRUCell(hidden + 1 + 2 * NUM_DEVICE_FEATURES, hidden)
        self.actor = nn.Sequential(
            nn.Linear(hidden + NUM_DEVICE_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )
        self.critic = _mlp(hidden + 2 * NUM_DEVICE_FEATURES, hidden, 1)

    def step(self, table: torch.Tensor, progress: float, device_features: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[H] table encoding, [K, D, F] device features, [K, H] GRU state -> logits [K, D], value [K], new state."""
        # mean and max over devices: the same weights serve any number of devices
        pooled = torch.cat([device_features.mean(dim=1), device_features.amax(dim=1)], dim=-1)
        k = device_features.shape[0]
        step_in = torch.cat([table.expand(k, -1), torch.full((k, 1), progress, device=table.device), pooled], -1)
        state = self.gru(step_in, state)
        d = device_features.shape[1]
        logits = self.actor(torch.cat([state.unsqueeze(1).expand(k, d, -1), device_features], -1)).squeeze(-1)
        value = self.critic(torch.cat([state, pooled], -1)).squeeze(-1)
        return logits, value, state


@dataclass
class _Episode:
    assignments: np.ndarray  # [K, T]
    log_probs: torch.Tensor  # [K, T]
    entropies: torch.Tensor  # [K, T]
    values: torch.Tensor  # [K, T]
    rewards: np.ndarray  # [K, T]
    alive: np.ndarray  # [K, T] steps taken before the episode ran out of memory
    feasible: np.ndarray  # [K]
    final_cost: np.ndarray  # [K] predicted plan cost in units of the task's scale


class _Layouts:
    """K partial placements of one task with their CostModel costs, updated one table at a time."""

    def __init__(self, cost_model: CostModel, prepared: PlacementTask, k: int) -> None:
        d, h = prepared.num_devices, prepared.embeddings.shape[1]
        self.cost_model, self.prepared, self.k, self.d = cost_model, prepared, k, d
        self.summed = np.zeros((k, d, h))
        self.compute = np.zeros((k, d))  # fwd + bwd ms
        self.total = np.zeros((k, d))  # compute + all-to-all ms
        self.widths = np.zeros((k, d))
        self.used = np.zeros((k, d))
        self.counts = np.zeros((k, d))

    def candidates(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Costs if table t goes to each device: that device's compute [K, D], and every device's total [K, Dc, D]."""
        p, k, d = self.prepared, self.k, self.d
        grown = self.summed + p.embeddings[t]
        compute_self = np.asarray(self.cost_model.compute_from_embeddings(grown.reshape(k * d, -1))).sum(1).reshape(k, d)
        eye = np.eye(d, dtype=bool)
        compute = np.where(eye[None], compute_self[:, None, :], self.compute[:, None, :])  # [K, Dc, D]
        widths = self.widths[:, None, :] + eye[None] * p.dims[t]
        comm = np.asarray(self.cost_model.predict_comm(widths.reshape(k * d, d), compute.reshape(k * d, d)))
        total = compute + comm.sum(axis=2).reshape(k, d, d)
        return compute_self, total, widths

    def place(self, t: int, actions: np.ndarray, compute_self: np.ndarray, total: np.ndarray,
              widths: np.ndarray) -> None:
        """Put table t on `actions` [K]."""
        rows = np.arange(self.k)
        self.summed[rows, actions] += self.prepared.embeddings[t]
        self.compute[rows, actions] = compute_self[rows, actions]
        self.total = total[rows, actions]
        self.widths = widths[rows, actions]
        self.used[rows, actions] += self.prepared.memory_bytes[t]
        self.counts[rows, actions] += 1


class AutoShardPolicy:
    """A trained AutoShard actor-critic network."""

    method = METHOD

    def __init__(self, config: AutoShardConfig, network: AutoShardNetwork | None = None,
                 provenance: dict[str, Any] | None = None) -> None:
        self.config = config
        self.network = network or AutoShardNetwork(NUM_FEATURES, config.hidden)
        self.provenance = dict(provenance or {})
        self.device = torch.device("cpu")

    def to(self, device: str | torch.device) -> AutoShardPolicy:
        """Move the network to `device`."""
        self.device = torch.device(device)
        self.network.to(self.device)
        return self

    def rollout(self, cost_model: CostModel, prepared: PlacementTask, rollouts: int, greedy: bool,
                generator: torch.Generator | None = None) -> _Episode:
        """Place the task's tables `rollouts` times (argmax or sampled), costs from the CostModel."""
        dev, k, d, t_count = self.device, rollouts, prepared.num_devices, prepared.num_tables
        scale, capacity = prepared.scale_ms, float(prepared.capacity_bytes)
        layouts = _Layouts(cost_model, prepared, k)
        tables = self.network.table(torch.as_tensor(prepared.features, device=dev))
        state = torch.zeros(k, self.config.hidden, device=dev)
        total_width = float(prepared.dims.sum())
        actions = np.zeros((k, t_count), dtype=np.int64)
        rewards = np.zeros((k, t_count))
        alive = np.ones((k, t_count), dtype=bool)
        feasible = np.ones(k, dtype=bool)
        log_probs, entropies, values = [], [], []
        rows = np.arange(k)
        for t in range(t_count):
            compute_self, total, widths = layouts.candidates(t)
            plan_after = total.max(axis=2)  # [K, Dc]
            plan_now = layouts.total.max(axis=1, keepdims=True)
            self_after = total[:, np.arange(d), np.arange(d)]
            used_after = layouts.used + prepared.memory_bytes[t]
            unit = max(float(prepared.table_cost_ms[t]), 1e-9)
            features = np.stack(
                [
                    layouts.compute / scale, layouts.total / scale, self_after / scale, plan_after / scale,
                    np.broadcast_to(plan_now / scale, (k, d)), layouts.used / capacity, used_after / capacity,
                    layouts.widths / total_width,
                    np.clip((plan_after - plan_now) / unit, -10, 10),
                    np.clip((self_after - self_after.min(axis=1, keepdims=True)) / unit, 0, 10),
                ],
                axis=-1,
            )
            legal = legal_devices(prepared, layouts.used, t)
            logits, value, state = self.network.step(
                tables[t], t / t_count, torch.as_tensor(features, dtype=torch.float32, device=dev), state
            )
            logits = masked_logits(logits, torch.as_tensor(legal, device=dev))
            dist = torch.distributions.Categorical(logits=logits)
            if greedy:
                action = logits.argmax(dim=-1).cpu()
            else:
                # sample on the CPU generator so seeded runs agree across devices
                action = torch.multinomial(dist.probs.detach().cpu(), 1, generator=generator).squeeze(-1)
            a = action.numpy()
            log_probs.append(dist.log_prob(action.to(dev)))
            entropies.append(dist.entropy())
            values.append(value)
            alive[:, t] = feasible
            ran_out = feasible & ~legal[rows, a]
            growth = (plan_after[rows, a] - plan_now[:, 0]) / scale
            rewards[:, t] = np.where(feasible, -growth, 0.0)
            rewards[ran_out, t] = -self.config.infeasible_penalty
            feasible &= ~ran_out
            actions[:, t] = a
            layouts.place(t, a, compute_self, total, widths)
        final_cost = layouts.total.max(axis=1) / scale
        if not self.config.shaped_reward:
            rewards[:] = 0.0
            rewards[:, -1] = np.where(feasible, -final_cost, -self.config.infeasible_penalty)
        return _Episode(
            assignments=actions, log_probs=torch.stack(log_probs, 1), entropies=torch.stack(entropies, 1),
            values=torch.stack(values, 1), rewards=rewards, alive=alive, feasible=feasible, final_cost=final_cost,
        )

    @torch.no_grad()
    def candidates(self, cost_model: CostModel, prepared: PlacementTask, samples: int, seed: int) -> list[np.ndarray]:
        """The greedy placement, then `samples` sampled ones (seeded)."""
        self.network.eval()
        out = [self.rollout(cost_model, prepared, 1, greedy=True).assignments[0]]
        if samples > 0:
            generator = torch.Generator().manual_seed(seed)
            out += list(self.rollout(cost_model, prepared, samples, greedy=False, generator=generator).assignments)
        return out

    def save(self, directory: str | Path) -> Path:
        """Write the policy (state_dict + JSON config) to `directory`."""
        return save_policy(directory, METHOD, asdict(self.config), self.network.state_dict(), self.provenance)

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> AutoShardPolicy:
        """Read a policy written by `save`."""
        config_doc, state, provenance = read_policy(directory, METHOD)
        with checked_policy(directory):
            policy = cls(AutoShardConfig(**config_doc), provenance=provenance)
            load_checked_state(policy.network, state)
        return policy.to(device)



def _train_autoshard(
    cost_model: CostModel,
    tasks: Sequence[ShardingTask],
    seed: int,
    config: AutoShardConfig | None = None,
    *,
    device: str | None = None,
    progress: bool = True,
) -> tuple[AutoShardPolicy, list[dict[str, float]]]:
    """Train an AutoShard policy on `tasks` against `cost_model`; returns it and per-episode statistics."""
    if not tasks:
        raise ValueError("tasks: need at least one training task")
    config = config or AutoShardConfig()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    dev = select_device(device)
    policy = AutoShardPolicy(config).to(dev)
    prepared = [prepare_task(task, cost_model) for task in tasks]
    optimizer = torch.optim.Adam(policy.network.parameters(), lr=config.lr)
    history: list[dict[str, float]] = []
    policy.network.train()
    from tqdm.auto import tqdm  # training only: planning with a trained policy shows no bar

    for episode in tqdm(range(config.episodes), desc="autoshard", disable=not progress):
        i = int(rng.integers(len(prepared)))
        ep = policy.rollout(cost_model, prepared[i], config.rollouts, greedy=False, generator=generator)
        # returns-to-go (undiscounted: the rewards telescope to minus the final plan cost)
        returns = torch.as_tensor(np.flip(np.flip(ep.rewards, 1).cumsum(1), 1).copy(), dtype=torch.float32,
                                  device=dev)
        alive = torch.as_tensor(ep.alive, dtype=torch.float32, device=dev)
        advantage = (returns - ep.values).detach()
        steps = alive.sum().clamp_min(1.0)
        actor_loss = -(advantage * ep.log_probs * alive).sum() / steps
        critic_loss = (((returns - ep.values) ** 2) * alive).sum() / steps
        entropy = (ep.entropies * alive).sum() / steps
        loss = actor_loss + config.value_weight * critic_loss - config.entropy_weight * entropy
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(policy.network.parameters(), 1.0)
        optimizer.step()
        history.append({
            "episode": float(episode), "cost": float(ep.final_cost[ep.feasible].mean()) if ep.feasible.any() else float("nan"),
            "critic_loss": float(critic_loss.detach()), "feasible_fraction": float(ep.feasible.mean()),
        })
    policy.network.eval()
    recent = [h["cost"] for h in history[-20:] if np.isfinite(h["cost"])]
    policy.provenance = {
        "method": METHOD, "seed": seed, "num_tasks": len(tasks), "hardware_kind": cost_model.hardware_kind,
        "batch_size": cost_model.batch_size, "final_cost": float(np.mean(recent)) if recent else float("nan"),
    }
    return policy, history


def train_autoshard(
    cost_model: CostModel,
    tasks: Sequence[ShardingTask],
    seed: int,
    config: AutoShardConfig | None = None,
    *,
    device: str | None = None,
    progress: bool = True,
) -> tuple[AutoShardPolicy, list[dict[str, float]]]:
    """Train a AutoShard policy on `tasks` against `cost_model`; returns it and training statistics."""
    with single_thread():
        return _train_autoshard(cost_model, tasks, seed, config, device=device, progress=progress)


def train_for_episodes(
    cost_model: CostModel,
    tasks: Sequence[ShardingTask],
    seed: int,
    *,
    episodes: int = 200,
    device: str | None = None,
    progress: bool = True,
) -> tuple[AutoShardPolicy, list[dict[str, float]]]:
    """Train with the default config for `episodes` episodes."""
    return train_autoshard(cost_model, tasks, seed, AutoShardConfig(episodes=episodes), device=device,
                           progress=progress)


#: what the registry's autoshard entry loads and trains with (registered in policy_methods.py, without torch)
HOOKS = PolicyHooks(load=AutoShardPolicy.load, train=train_for_episodes)
