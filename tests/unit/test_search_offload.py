"""Tables larger than HBM: the offload stage puts the tables cheapest to cache in host memory, within both memories,
and refuses in one line where nothing fits or the cost model has not measured the UVM kernels."""

from __future__ import annotations

import pytest
from caching_doubles import CachingCostModel
from search_doubles import FeatureCostModel

from shardwise.search import NeuroShardSearch, PlanError, validate_plan
from shardwise.search.plan import plan_host_memory_bytes, plan_memory_bytes
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes

UVM = ("fused", "fused_uvm_caching")
BATCH = 4096


def tables(skews: list[float], poolings: list[float], kernels: tuple[str, ...] | None = UVM) -> list[TableSpec]:
    return [TableSpec(name=f"t{i}", rows=200_000, dim=64, pooling_factor=p, zipf_alpha=a, compute_kernels=kernels)
            for i, (a, p) in enumerate(zip(skews, poolings, strict=True))]


def task(specs: list[TableSpec], hbm_share: float, host_bytes: int | None = 2**34, devices: int = 2) -> ShardingTask:
    """`specs` over `devices` devices whose HBM holds `hbm_share` of what the tables need in all."""
    need = shard_memory_bytes(specs, BATCH)
    return ShardingTask(num_devices=devices, device_memory_bytes=int(hbm_share * need / devices), batch_size=BATCH,
                        tables=tuple(specs), host_memory_bytes=host_bytes)


def cached(plan) -> set[str]:
    return {name for name, k in plan.kernels.items() if k.kernel == "fused_uvm_caching"}


def test_a_task_that_fits_in_hbm_is_planned_as_before() -> None:
    specs = tables([0.0, 1.2, 0.5, 1.0], [10, 20, 5, 8])
    roomy = task(specs, hbm_share=1.5)
    plain = roomy.model_copy(update={"tables": tuple(t.model_copy(update={"compute_kernels": None}) for t in specs),
                                     "host_memory_bytes": None})
    model = CachingCostModel()
    plan = NeuroShardSearch().search(roomy, model, seed=0)
    before = NeuroShardSearch().search(plain, model, seed=0)
    assert plan.kernels == {} and "kernels" not in plan.to_json()
    assert plan.shards == before.shards
    assert plan.extra["predicted"] == before.extra["predicted"]


def test_a_task_over_hbm_caches_the_most_skewed_tables_within_both_memories() -> None:
    skewed = [1.3, 1.3, 1.3, 1.3]
    flat = [0.0, 0.0, 0.0, 0.0]
    over = task(tables(flat + skewed, [10] * 8), hbm_share=0.7)
    plan = NeuroShardSearch().search(over, CachingCostModel(), seed=0)
    validate_plan(plan, over)
    assert cached(plan) and cached(plan) <= {"t4", "t5", "t6", "t7"}
    assert max(plan_memory_bytes(plan, over)) <= over.device_memory_bytes
    assert max(plan_host_memory_bytes(plan, over)) <= over.host_memory_bytes
    assert plan.extra["host_memory_bytes"] == plan_host_memory_bytes(plan, over)
    assert all(k.cache_load_factor in (0.1, 0.2, 0.5) for k in plan.kernels.values())


def test_a_task_over_hbm_caches_the_least_looked_up_tables() -> None:
    over = task(tables([0.8] * 6, [2, 2, 2, 40, 40, 40]), hbm_share=0.75)
    plan = NeuroShardSearch().search(over, CachingCostModel(), seed=0)
    validate_plan(plan, over)
    assert cached(plan) and cached(plan) <= {"t0", "t1", "t2"}


def test_only_tables_whose_plan_space_allows_it_leave_hbm() -> None:
    specs = tables([1.3, 1.3, 0.0, 0.0], [10] * 4, kernels=None)
    specs[2] = specs[2].model_copy(update={"compute_kernels": UVM})
    specs[3] = specs[3].model_copy(update={"compute_kernels": UVM})
    over = task(specs, hbm_share=0.8)
    plan = NeuroShardSearch().search(over, CachingCostModel(), seed=0)
    assert cached(plan) and cached(plan) <= {"t2", "t3"}


def test_a_task_over_both_memories_is_refused_in_one_line() -> None:
    over = task(tables([1.0] * 4, [10] * 4), hbm_share=0.5, host_bytes=2**20)
    with pytest.raises(PlanError) as err:
        NeuroShardSearch().search(over, CachingCostModel(), seed=0)
    assert "\n" not in str(err.value) and "host memory" in str(err.value)


def test_a_cost_model_without_measured_caching_is_refused_naming_the_kernel_and_how_to_profile() -> None:
    over = task(tables([1.0] * 4, [10] * 4), hbm_share=0.6)
    with pytest.raises(PlanError) as err:
        NeuroShardSearch().search(over, FeatureCostModel(), seed=0)
    message = str(err.value)
    assert "\n" not in message
    assert "has not measured 'fused_uvm_caching'" in message and "--device cuda" in message


def test_a_task_without_host_memory_keeps_every_table_in_hbm() -> None:
    over = task(tables([1.0] * 4, [10] * 4), hbm_share=0.6, host_bytes=None)
    with pytest.raises(PlanError, match="no plan fits"):
        NeuroShardSearch().search(over, CachingCostModel(), seed=0)


def test_fused_uvm_takes_the_tables_a_cache_cannot_hold() -> None:
    specs = tables([0.0] * 4, [1] * 4, kernels=("fused", "fused_uvm_caching", "fused_uvm"))
    over = task(specs, hbm_share=0.2)
    plan = NeuroShardSearch().search(over, CachingCostModel(), seed=0)
    validate_plan(plan, over)
    assert "fused_uvm" in {k.kernel for k in plan.kernels.values()}


def test_the_plan_command_puts_tables_in_host_memory_with_a_model_that_measured_them(tmp_path, monkeypatch,
                                                                                      capsys) -> None:
    from costmodel_synthetic import cost_frame, synthetic_tables

    from shardwise.cli import main
    from shardwise.costmodel import TrainConfig, train_cost_model
    from shardwise.costmodel.caching import KernelLine
    from shardwise.search import load_plan
    from shardwise.workload import save_task

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/none.db")
    from shardwise.profiling import hardware_kind

    # this machine's hardware, so that --refine may measure here
    model, _ = train_cost_model(cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0,
                                           hardware_kind=hardware_kind("cpu")), 0, TrainConfig(epochs=3, progress=False))
    model.save(tmp_path / "hbm_only")
    model.uvm_kernels = {"fused_uvm_caching": KernelLine((400.0, 800.0), (0.01, 0.01), 20)}
    model.save(tmp_path / "with_uvm")
    save_task(task(tables([0.0, 0.5, 1.0, 1.3], [10] * 4), hbm_share=0.6), "task.json")

    assert main(["plan", "--task", "task.json", "--model", "hbm_only", "--out", "plan.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has not measured 'fused_uvm_caching'" in err and len(err.splitlines()) == 1
    assert main(["plan", "--task", "task.json", "--model", "with_uvm", "--out", "plan.json"]) == 0
    assert "in host memory (memory GiB above is HBM, with their caches): " in capsys.readouterr().out
    plan = load_plan("plan.json")
    assert plan.kernels and all(k.kernel == "fused_uvm_caching" for k in plan.kernels.values())
    # refinement moves and measures tables in HBM: refused in one line before anything is measured
    assert main(["plan", "--task", "task.json", "--model", "with_uvm", "--out", "refined.json", "--refine", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "refinement keeps tables in HBM" in err and len(err.splitlines()) == 1


def test_a_placement_that_finds_no_fit_moves_more_tables_and_places_again(monkeypatch) -> None:
    from shardwise.search import offload

    # fill HBM to the brim before placing: the buffers the state leaves out then overflow it, and a round more moves
    monkeypatch.setattr(offload, "HBM_FILL", 1.0)
    specs = [TableSpec(name=f"t{i}", rows=20_000, dim=64, pooling_factor=4.0, zipf_alpha=1.0, compute_kernels=UVM)
             for i in range(6)]
    need = shard_memory_bytes(specs, 65536)
    over = ShardingTask(num_devices=2, device_memory_bytes=int(0.45 * need), batch_size=65536, tables=tuple(specs),
                        host_memory_bytes=2**34)
    attempts: list[int] = []
    search = NeuroShardSearch()
    inner = search._search

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        attempts.append(len(args[0].tables))
        return inner(*args, **kwargs)

    monkeypatch.setattr(search, "_search", counted)
    plan = search.search(over, CachingCostModel(), seed=0)
    validate_plan(plan, over)
    assert len(attempts) >= 3  # as the task is, with the first moves, with more
