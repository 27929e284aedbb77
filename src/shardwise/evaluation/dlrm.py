"""End-to-end check: train a TorchRec DLRM sharded by a plan with DistributedModelParallel; samples/s."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing import start_processes

from shardwise.profiling import resolve_device
from shardwise.profiling.processes import main_module_hidden
from shardwise.search.plan import Plan, plan_from_json, validate_plan
from shardwise.search.torchrec_plan import to_sharding_plan
from shardwise.workload import ShardingTask, sample_batch, stable_seed, task_from_json

from .measured_records import DLRMThroughput

#: the module path of the EmbeddingBagCollection inside the model (TorchRec's DLRM layout)
EBC_PATH = "sparse_arch.embedding_bag_collection"
DENSE_IN_FEATURES = 13  # Criteo's dense features
#: distinct synthetic batches per rank, cycled (sampling index data every step would time numpy, not the model)
NUM_DISTINCT_BATCHES = 4
#: default global batch of a CPU run (unless `batch_size` is given)
CPU_BATCH_SIZE = 4096


class ProjectedSparseArch(nn.Module):
    """TorchRec's SparseArch for tables of different widths: each feature projected to a common dim."""

    def __init__(self, embedding_bag_collection: nn.Module, dims: dict[str, int], out_dim: int, device=None):
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        self.feature_names = list(dims)
        self.projections = nn.ModuleDict(
            {name: nn.Linear(dim, out_dim, bias=False, device=device) for name, dim in dims.items()}
        )
        self.out_dim = out_dim

    def forward(self, features: Any) -> torch.Tensor:
        """KJT -> [B, F, D]; features selected by key (the sharded collection groups keys by rank)."""
        pooled = self.embedding_bag_collection(features).to_dict()
        projected = [self.projections[name](pooled[name]) for name in self.feature_names]
        return torch.stack(projected, dim=1)


def build_dlrm(task: ShardingTask, *, dense_device: torch.device, embedding_device: torch.device) -> nn.Module:
    """TorchRec's DLRM over the task's tables (one feature per table); per-table projections when dims differ."""
    # torchrec: heavy (seconds to import), needed only when a DLRM is built
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name])
        for t in task.tables
    ]
    ebc = EmbeddingBagCollection(tables=configs, device=embedding_device)
    dims = {t.name: t.dim for t in task.tables}
    if len(set(dims.values())) == 1:
        dim = task.tables[0].dim
        return DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=DENSE_IN_FEATURES,
            dense_arch_layer_sizes=[64, dim],
            over_arch_layer_sizes=[64, 32, 1],
            dense_device=dense_device,
        )
    return _ProjectedDLRM(ebc, dims, dense_device)


class _ProjectedDLRM(nn.Module):
    """DLRM (TorchRec's dense, interaction and over archs) with per-table projections to a shared dim."""

    def __init__(self, ebc: nn.Module, dims: dict[str, int], device: torch.device, common_dim: int = 32):
        super().__init__()
        # torchrec: heavy (seconds to import), needed only when a DLRM is built
        from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch, choose

        num_features = len(dims)
        self.sparse_arch = ProjectedSparseArch(ebc, dims, common_dim, device=device)
        self.dense_arch = DenseArch(DENSE_IN_FEATURES, [64, common_dim], device=device)
        self.inter_arch = InteractionArch(num_sparse_features=num_features)
        over_in = common_dim + choose(num_features, 2) + num_features
        self.over_arch = OverArch(over_in, [64, 32, 1], device=device)

    def forward(self, dense_features: torch.Tensor, sparse_features: Any) -> torch.Tensor:
        """Logits [B, 1]."""
        dense = self.dense_arch(dense_features)
        sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(dense_features=dense, sparse_features=sparse))


def synthetic_batch(task: ShardingTask, batch_size: int, rank: int, step: int) -> tuple[Any, Any, Any]:
    """(dense [B, 13], KeyedJaggedTensor over the task's tables, labels [B]) for one rank and step, seeded."""
    # torchrec: heavy (seconds to import), needed only when a DLRM is trained
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths, values = [], []
    for t in task.tables:
        seed = stable_seed(t.source or t.name, "dlrm", rank, step)
        lens, idx = sample_batch(t, batch_size, seed=seed)
        lengths.append(torch.from_numpy(lens))
        values.append(torch.from_numpy(idx))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[t.name for t in task.tables], values=torch.cat(values), lengths=torch.cat(lengths)
    )
    gen = torch.Generator().manual_seed(stable_seed("dense", rank, step))
    dense = torch.rand(batch_size, DENSE_IN_FEATURES, generator=gen)
    labels = torch.randint(0, 2, (batch_size,), generator=gen).float()
    return dense, kjt, labels


def _hide_library_notices() -> None:
    """Two notices every rank printed once per plan, about torchrec's own use of torch and nothing a user can act
    on (24 lines on the console of `shardwise validate` with two plans on 4 ranks): DDP's `broadcast_buffers`
    deprecation, and torch.fx's note on `is_fx_tracing`. A spawned rank starts with Python's default filters,
    not the parent's."""
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


def _worker(rank: int, world_size: int, init_file: str, out_dir: str, job: dict[str, Any]) -> None:
    """One rank: for each plan in turn, build, shard and train; writes its per-iteration ms of plan i to
    out_dir/rank{rank}_plan{i}.json. One process group serves every plan (spawning the ranks and importing
    TorchRec cost seconds per plan), and the plans run back to back in the same processes."""
    _hide_library_notices()
    device_kind = job["device_kind"]
    if device_kind == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        torch.set_num_threads(job["num_threads"])
        backend = "gloo"
    task = task_from_json(job["task"])
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        for i, plan_doc in enumerate(job["plans"]):
            iter_ms, loss = _train(rank, task, plan_from_json(plan_doc), device, job)
            Path(out_dir, f"rank{rank}_plan{i}.json").write_text(json.dumps({"iter_ms": iter_ms, "loss": loss}))
    finally:
        dist.destroy_process_group()


def _train(
    rank: int, task: ShardingTask, plan: Plan, device: torch.device, job: dict[str, Any]
) -> tuple[list[float], float]:
    """Train the task's DLRM sharded by `plan` on this rank: (per timed iteration ms, last loss)."""
    # fbgemm_gpu, torchrec: heavy (seconds to import), needed only in the training processes
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    torch.manual_seed(job["seed"])  # every plan's model starts from the same weights and sees the same batches
    model = build_dlrm(task, dense_device=device, embedding_device=torch.device("meta"))
    # fused kernel: the optimizer runs inside fbgemm's backward, as in production (and as profiled)
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}
    )
    sharding_plan = to_sharding_plan(
        plan, task, module_path=EBC_PATH, device_type=device.type, local_world_size=dist.get_world_size()
    )
    model = DistributedModelParallel(module=model, device=device, plan=sharding_plan, sharders=[sharder])
    dense_params = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = KeyedOptimizerWrapper(dense_params, lambda params: torch.optim.SGD(params, lr=0.01))
    loss_fn = nn.BCEWithLogitsLoss()
    local_batch = job["local_batch_size"]
    batches = [
        tuple(x.to(device) for x in synthetic_batch(task, local_batch, rank, step))
        for step in range(NUM_DISTINCT_BATCHES)
    ]
    iter_ms: list[float] = []
    for step in range(job["warmup"] + job["iters"]):
        dense, kjt, labels = batches[step % NUM_DISTINCT_BATCHES]
        dist.barrier()  # every rank starts the iteration together: the slowest sets the pace
        start = time.perf_counter()
        optimizer.zero_grad()
        logits = model(dense, kjt).squeeze(-1)
        loss = loss_fn(logits, labels)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= job["warmup"]:
            iter_ms.append((time.perf_counter() - start) * 1e3)
        if not torch.isfinite(loss):
            raise RuntimeError(f"rank {rank}: loss is {loss.item()} with plan {plan.method} at step {step}")
    dist.barrier()  # no rank builds the next plan's model while another still trains this one
    return iter_ms, loss.item()


def measure_dlrm_throughputs(
    task: ShardingTask,
    plans: Sequence[Plan],
    *,
    iters: int = 20,
    warmup: int = 5,
    world_size: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    num_threads: int = 1,
    seed: int = 0,
) -> list[DLRMThroughput]:
    """Train the task's DLRM sharded by each plan in turn (one process per device) and time it; refuses invalid
    plans. The plans run one after another in the same ranks: one start of the processes (and of TorchRec's
    import) for all of them, and the same processes for each, a fairer comparison.

    `batch_size` is the global batch (split evenly across ranks); default the task's on CUDA, at most
    CPU_BATCH_SIZE on CPU.
    """
    if not plans:
        raise ValueError("plans: nothing to train")
    for plan in plans:
        validate_plan(plan, task)
    world_size = world_size or plans[0].num_devices
    if any(plan.num_devices != world_size for plan in plans):
        raise ValueError(f"world_size {world_size} must equal every plan's num_devices "
                         f"({sorted({p.num_devices for p in plans})})")
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0 (got iters {iters}, warmup {warmup})")
    dev = resolve_device(device)
    if dev.type == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"{world_size} ranks need {world_size} GPUs; this node has {torch.cuda.device_count()}")
    # the task's batch is sized for accelerators; a CPU run defaults to a scaled-down one
    global_batch = batch_size or (task.batch_size if dev.type == "cuda" else min(task.batch_size, CPU_BATCH_SIZE))
    local_batch = max(1, global_batch // world_size)
    job = {
        "task": task.to_json(),
        "plans": [plan.to_json() for plan in plans],
        "device_kind": dev.type,
        "local_batch_size": local_batch,
        "iters": iters,
        "warmup": warmup,
        "num_threads": num_threads,
        "seed": seed,
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="shardwise-dlrm-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        with main_module_hidden():
            ranks = start_processes(_worker, args=(world_size, init_file, tmp, job), nprocs=world_size, join=False,
                                    start_method="spawn")
        while not ranks.join():  # torch's own wait for join=True: raises when a rank failed
            pass
        for i, plan in enumerate(plans):
            per_rank = [json.loads(Path(tmp, f"rank{r}_plan{i}.json").read_text())["iter_ms"]
                        for r in range(world_size)]
            slowest = tuple(max(ms) for ms in zip(*per_rank))
            results.append(DLRMThroughput(
                method=plan.method,
                world_size=world_size,
                backend="nccl" if dev.type == "cuda" else "gloo",
                device_kind=dev.type,
                global_batch_size=local_batch * world_size,
                iters=iters,
                warmup=warmup,
                iter_ms=slowest,
                samples_per_s=local_batch * world_size * len(slowest) / (sum(slowest) / 1e3),
            ))
    return results
