"""The two networks: compute (per-table MLP, sum over a shard's tables, head) and communication (per device)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def subnormal(tensor: torch.Tensor) -> torch.Tensor:
    """Where `tensor` holds a float below float32's normal range (0 < |x| < 1.2e-38)."""
    return (tensor != 0) & (tensor.abs() < torch.finfo(torch.float32).tiny)


@torch.no_grad()
def zero_subnormal_weights(module: nn.Module) -> None:
    """Set the parameters below float32's normal range (`subnormal`) to exact zero.

    Weight decay leaves many of them, and a CPU that handles subnormal operands in microcode pays for each one in
    every prediction: NeuroShard ran many times slower with them on an Intel Xeon, an AMD EPYC barely slows (record
    `subnormals`). Zero is what they are worth: no plan changes."""
    for param in module.parameters():
        param.masked_fill_(subnormal(param), 0.0)


def mlp(in_features: int, hidden: int, out_features: int, layers: int) -> nn.Sequential:
    """`layers` hidden ReLU layers of width `hidden`, then a linear output."""
    modules: list[nn.Module] = []
    width = in_features
    for _ in range(layers):
        modules += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    modules.append(nn.Linear(width, out_features))
    return nn.Sequential(*modules)


def run_mlp(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """`net(x)` for an `mlp`, layer by layer through torch's functions: the same arithmetic without a module call
    per layer, which on search's thousands of small batches costs more than the layers' own arithmetic."""
    for layer in net:
        if isinstance(layer, nn.Linear):
            x = nn.functional.linear(x, layer.weight, layer.bias)
        elif isinstance(layer, nn.ReLU):
            x = torch.relu(x)
        else:
            x = layer(x)
    return x


class ComputeNet(nn.Module):
    """Per-table encoder -> sum over the shard -> head -> log fwd/bwd ms.

    A table's embedding is [learned (hidden) | work channels (linear scale) | 1]: the sum then carries the
    shard's total work and how many tables the fused kernel runs (an empty shard has count 0). The head sees
    the learned sum as is and log1p of the work and count sums (1 vs 15 tables spans an order of magnitude).
    The per-table MLP sees the normalised features and log1p of the work channels."""

    def __init__(
        self, num_features: int, hidden: int = 64, layers: int = 2, head_layers: int = 2, work_channels: int = 5
    ) -> None:
        super().__init__()
        self.num_features = num_features
        self.hidden = hidden
        self.embedding_dim = hidden + work_channels + 1
        self.table_mlp = mlp(num_features + work_channels, hidden, hidden, layers)
        self.head = mlp(self.embedding_dim, hidden, 2, head_layers)

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """[T, F + W] normalised features and work channels -> [T, hidden + W + 1] embeddings."""
        ones = torch.ones(inputs.shape[:-1] + (1,), dtype=inputs.dtype, device=inputs.device)
        work = inputs[..., self.num_features :]
        learned = self.table_mlp(torch.cat([inputs[..., : self.num_features], torch.log1p(work.clamp_min(0.0))], dim=-1))
        return torch.cat([learned, work, ones], dim=-1)

    def head_log_ms(self, summed: torch.Tensor) -> torch.Tensor:
        """[N, embedding_dim] summed embeddings -> [N, 2] log fwd/bwd ms (centred by the model's offset)."""
        learned, totals = summed[..., : self.hidden], summed[..., self.hidden :]
        return run_mlp(self.head, torch.cat([learned, torch.log1p(totals.clamp_min(0.0))], dim=-1))

    def forward(self, features: torch.Tensor, shard_index: torch.Tensor, num_shards: int) -> torch.Tensor:
        """Flat [T, F] features of all tables, [T] shard of each table -> [num_shards, 2] log ms."""
        emb = self.embed(features)
        summed = torch.zeros(num_shards, emb.shape[1], dtype=emb.dtype, device=emb.device)
        summed.index_add_(0, shard_index, emb)
        return self.head_log_ms(summed)


class CommNet(nn.Module):
    """Per-device communication features -> log fwd/bwd all-to-all ms (same weights for every device)."""

    def __init__(self, num_features: int, hidden: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.net = mlp(num_features, hidden, 2, layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., F] normalised features -> [..., 2] log ms (centred by the model's offset)."""
        return run_mlp(self.net, features)


def load_checked_state(net: nn.Module, tensors: Mapping[str, torch.Tensor], prefix: str = "") -> None:
    """Load `net`'s tensors stored under `prefix` in `tensors`; a ValueError names a missing, unexpected,
    misshapen or non-finite tensor (a damaged file never loads half-way or predicts NaN)."""
    own = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    expected = net.state_dict()
    missing, extra = sorted(set(expected) - set(own)), sorted(set(own) - set(expected))
    if missing or extra:
        raise ValueError(f"tensors do not match the configured network (missing {[prefix + k for k in missing[:3]]}, "
                         f"unexpected {[prefix + k for k in extra[:3]]})")
    for key, tensor in own.items():
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(expected[key].shape):
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"tensor {prefix + key!r} has shape {shape}, the configured network needs "
                             f"{tuple(expected[key].shape)}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"tensor {prefix + key!r} holds NaN or infinite weights")
    net.load_state_dict(own)
