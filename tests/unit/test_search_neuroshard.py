import numpy as np
import pytest
import torch
from search_doubles import FeatureCostModel, random_task

from shardwise.costmodel.data_parallel import AllReduceCost
from shardwise.search import (
    NeuroShardConfig,
    NeuroShardSearch,
    PlanError,
    make_searcher,
    simulate,
    validate_plan,
)
from shardwise.workload import ShardingTask, TableSpec, shard_memory_bytes
from shardwise.workload.synthetic import synthesize_tables
from shardwise.workload.tableset import sample_task

torch.set_num_threads(1)
GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")


@pytest.fixture(scope="module")
def tableset():
    return synthesize_tables(120, seed=0, row_scale=0.01, batch_size=4096, progress=False)


def mean_costs(tasks, model, methods):
    costs = {m: [] for m in methods}
    for seed, task in enumerate(tasks):
        for m in methods:
            plan = make_searcher(m).search(task, model, seed)
            validate_plan(plan, task)
            costs[m].append(plan.extra["predicted"]["max_cost_ms"])
    return {m: float(np.mean(c)) for m, c in costs.items()}


def test_neuroshard_beats_every_greedy_baseline_on_synthetic_dlrm_tasks(tableset):
    tasks = [sample_task(tableset, n, 4, seed=s) for s, n in enumerate([10, 25, 40, 60])]
    tasks += [sample_task(tableset, 100, 8, seed=10)]
    costs = mean_costs(tasks, FeatureCostModel(), ("neuroshard", "random", *GREEDY))
    for method, cost in costs.items():
        assert costs["neuroshard"] <= cost, (method, costs)


def test_neuroshard_with_a_fitted_neural_cost_model(tableset, fitted_cost_model):
    model, _ = fitted_cost_model
    tasks = [sample_task(tableset, n, 4, seed=s) for s, n in enumerate([12, 30])]
    costs = mean_costs(tasks, model, ("neuroshard", *GREEDY))
    assert costs["neuroshard"] <= min(costs[m] for m in GREEDY), costs


@pytest.mark.parametrize("slack", [1.02, 1.2, 2.0])
def test_neuroshard_never_returns_a_plan_over_memory(slack):
    for seed in range(3):
        task = random_task(seed, 40, 4, memory_slack=slack)
        plan = NeuroShardSearch().search(task, FeatureCostModel(), seed)
        validate_plan(plan, task)
        assert max(plan.extra["memory_bytes"]) <= task.device_memory_bytes


def test_pricing_each_shard_on_the_least_loaded_devices_only_keeps_plans_in_memory_and_balanced(tableset):
    """On more devices than `device_candidates` the head prices each shard on the least-loaded allowed devices
    only: plans still fit, use every device, and cost about what pricing every device gives."""
    model = FeatureCostModel()
    for seed, slack in enumerate((1.05, 1.5)):
        task = sample_task(tableset, 60, 12, seed=seed, memory_slack=slack)
        everywhere = NeuroShardSearch(device_candidates=12).search(task, model, seed)
        shortlist = NeuroShardSearch(device_candidates=2).search(task, model, seed)
        validate_plan(shortlist, task)
        assert {s.device for s in shortlist.shards} == set(range(12))
        ratio = shortlist.extra["predicted"]["max_cost_ms"] / everywhere.extra["predicted"]["max_cost_ms"]
        assert ratio < 1.05, ratio


def test_the_reported_cost_is_the_simulated_cost_of_the_plan():
    task = random_task(3, 50, 8)
    model = FeatureCostModel()
    plan = NeuroShardSearch().search(task, model, 0)
    cost = simulate(plan, task, model)
    assert plan.extra["predicted"]["max_cost_ms"] == pytest.approx(cost.max_cost_ms, abs=1e-3)
    assert plan.extra["search"]["predicted_max_cost_ms"] == pytest.approx(cost.max_cost_ms, rel=1e-6, abs=1e-3)
    assert plan.extra["method"] == "neuroshard" and plan.extra["planning_time_s"] > 0


def test_column_splits_happen_when_they_pay_off():
    # one table far costlier than the rest: halving it across two devices shortens the slowest device
    task = random_task(0, 8, 4)
    hot = task.tables[0].model_copy(update={"dim": 128, "pooling_factor": 500.0})
    task = task.model_copy(update={"tables": (hot, *task.tables[1:]), "device_memory_bytes": 2**32})
    plan = NeuroShardSearch().search(task, FeatureCostModel(), 0)
    assert len([s for s in plan.shards if s.table == hot.name]) >= 2
    no_split = NeuroShardSearch(NeuroShardConfig(max_depth=0)).search(task, FeatureCostModel(), 0)
    assert plan.extra["predicted"]["max_cost_ms"] < no_split.extra["predicted"]["max_cost_ms"]


def test_a_split_asked_for_is_planned_around_and_memory_still_holds():
    # refinement asks for a table split where the measured slowest device is held up by it (evaluation.refine)
    task = random_task(0, 8, 4)
    name = task.tables[0].name
    plan = NeuroShardSearch(NeuroShardConfig(split=((name, 2),))).search(task, FeatureCostModel(), 0)
    validate_plan(plan, task)
    pieces = [s for s in plan.shards if s.table == name]
    assert len(pieces) >= 2 and len({s.device for s in pieces}) == len(pieces)
    options = plan.extra["provenance"]["options"]
    assert plan.extra["search"]["split_tables"][name] >= 2 and [list(x) for x in options["split"]] == [[name, 2]]
    assert "split" not in NeuroShardSearch().search(task, FeatureCostModel(), 0).extra["provenance"]["options"]
    with pytest.raises(PlanError, match="split 'nope': the task has no such table"):
        NeuroShardSearch(NeuroShardConfig(split=(("nope", 2),))).search(task, FeatureCostModel(), 0)
    with pytest.raises(PlanError, match=f"split '{name}' into 8: pieces must be a power of two up to the 4 devices"):
        NeuroShardSearch(NeuroShardConfig(split=((name, 8),))).search(task, FeatureCostModel(), 0)


def test_bad_configs_and_missing_models_are_refused():
    with pytest.raises(ValueError, match="beam_width must be >= 1"):
        NeuroShardConfig(beam_width=0)
    with pytest.raises(ValueError, match="dim_cap_factors must be positive"):
        NeuroShardConfig(dim_cap_factors=(0.0,))
    with pytest.raises(PlanError, match="needs a cost model"):
        NeuroShardSearch().search(random_task(0, 5, 2), None, 0)


class _ModeProbe(FeatureCostModel):
    """FeatureCostModel that notes, at each compute call, whether torch flushes subnormals and on how many threads."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, int]] = []

    def compute_from_embeddings(self, summed: np.ndarray) -> np.ndarray:
        self.seen.append((_flushes_subnormals(), torch.get_num_threads()))
        return super().compute_from_embeddings(summed)


def _flushes_subnormals() -> bool:
    return float(torch.tensor([torch.finfo(torch.float32).tiny / 4]) * 1.0) == 0.0


def test_search_flushes_subnormals_while_it_runs_and_restores_the_default_after():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    torch.set_flush_denormal(False)
    threads = torch.get_num_threads()
    task = random_task(0, 12, 4)
    probe = _ModeProbe()
    plan = NeuroShardSearch().search(task, probe, 0)
    assert probe.seen and all(flushing for flushing, _ in probe.seen)  # a microcode assist each on many CPUs
    assert {n for _, n in probe.seen} == {1}
    assert not _flushes_subnormals()  # the rest of the process computes as before
    assert torch.get_num_threads() == threads
    # flushing changes no plan: the probe's costs are FeatureCostModel's
    assert plan.shards == NeuroShardSearch().search(task, FeatureCostModel(), 0).shards


# --- the plan space a task gives each table (what TorchRec's sharders and constraints allow) -----------------------
def _constrained(table: TableSpec, **plan_space: object) -> TableSpec:
    """`table` with a plan space, validated as a task file's would be."""
    return TableSpec.model_validate({**table.model_dump(), **plan_space})


def _with_table(task: ShardingTask, table: TableSpec) -> ShardingTask:
    return task.model_copy(update={"tables": tuple(table if t.name == table.name else t for t in task.tables)})


def _hot_task() -> ShardingTask:
    """The task of `test_column_splits_happen_when_they_pay_off`: unconstrained, its hot table goes in 4 slices of 32."""
    task = random_task(0, 8, 4)
    hot = task.tables[0].model_copy(update={"dim": 128, "pooling_factor": 500.0})
    return task.model_copy(update={"tables": (hot, *task.tables[1:]), "device_memory_bytes": 2**32})


def _slices(plan, name: str) -> list[int]:  # noqa: ANN001 - a Plan
    return sorted(s.dim for s in plan.shards if s.table == name)


def test_a_table_whose_plan_space_is_table_wise_is_kept_whole():
    task = _hot_task()
    hot = task.tables[0]
    assert _slices(NeuroShardSearch().search(task, FeatureCostModel(), 0), hot.name) == [32, 32, 32, 32]
    for types in (["table_wise"], ["table_wise", "row_wise", "data_parallel"]):
        constrained = _with_table(task, _constrained(hot, sharding_types=types))
        plan = NeuroShardSearch().search(constrained, FeatureCostModel(), 0)
        validate_plan(plan, constrained)
        assert _slices(plan, hot.name) == [128] and hot.name not in plan.extra["search"]["split_tables"]
    # column-wise alone still allows the whole table (one column shard) and the same split as no plan space
    column_wise = _with_table(task, _constrained(hot, sharding_types=["column_wise"]))
    assert _slices(NeuroShardSearch().search(column_wise, FeatureCostModel(), 0), hot.name) == [32, 32, 32, 32]


@pytest.mark.parametrize(("min_partition", "slices"), [(36, [64, 64]), (64, [64, 64]), (68, [128])])
def test_min_partition_bounds_how_narrow_the_search_splits_a_table(min_partition, slices):
    task = _hot_task()
    constrained = _with_table(task, _constrained(task.tables[0], min_partition=min_partition))
    plan = NeuroShardSearch().search(constrained, FeatureCostModel(), 0)
    validate_plan(plan, constrained)
    assert _slices(plan, task.tables[0].name) == slices


def test_a_split_asked_for_that_the_plan_space_forbids_is_refused_naming_the_table():
    task = _hot_task()
    name = task.tables[0].name
    whole = _with_table(task, _constrained(task.tables[0], sharding_types=["table_wise", "row_wise"]))
    with pytest.raises(PlanError, match=rf"split '{name}' into 2: its plan space \(sharding_types \['table_wise', "
                                        r"'row_wise'\]\) allows at most 1 column slice"):
        NeuroShardSearch(NeuroShardConfig(split=((name, 2),))).search(whole, FeatureCostModel(), 0)
    wide = _with_table(task, _constrained(task.tables[0], min_partition=64))
    with pytest.raises(PlanError, match=rf"split '{name}' into 4: its plan space \(any sharding type, min_partition 64\)"):
        NeuroShardSearch(NeuroShardConfig(split=((name, 4),))).search(wide, FeatureCostModel(), 0)
    plan = NeuroShardSearch(NeuroShardConfig(split=((name, 2),))).search(wide, FeatureCostModel(), 0)
    assert _slices(plan, name) == [64, 64]


class _CommHeavy(FeatureCostModel):
    """The feature double with a 20x dearer all-to-all and a cheap all-reduce: the search replicates small wide
    tables (as in test_search_data_parallel)."""

    all_reduce = AllReduceCost(0.001, 0.0, 0.1)

    def predict_comm(self, widths, compute_ms):  # noqa: ANN001, ANN201 - as FeatureCostModel's
        return 20 * super().predict_comm(widths, compute_ms)


class _PerIdCost(FeatureCostModel):
    """The feature double with a cost per id looked up and a measured reduce-scatter: the search splits a table
    that alone sets the slowest device by rows (as in test_search_row_wise)."""

    reduce_scatter = AllReduceCost(latency_ms=0.01, hop_ms=0.0, ms_per_mib=0.05, collective="reduce_scatter")

    def table_embeddings(self, tables):  # noqa: ANN001, ANN201 - as FeatureCostModel's
        return np.array([[1.0, t.pooling_factor * (t.dim + 256), t.rows * t.dim] for t in tables]).reshape(-1, 3)


REPLICABLE_TASK = ShardingTask(
    num_devices=4, device_memory_bytes=2**30, batch_size=4096,
    tables=(*(TableSpec(name=f"big{i}", rows=100_000, dim=64, pooling_factor=20.0) for i in range(6)),
            *(TableSpec(name=f"s{i}", rows=100, dim=128, pooling_factor=1.0) for i in range(10))))
ROW_WISE_TASK = ShardingTask(
    num_devices=4, device_memory_bytes=2**30, batch_size=4096,
    tables=(TableSpec(name="hot", rows=400_000, dim=64, pooling_factor=100.0),
            *(TableSpec(name=f"t{i}", rows=20_000, dim=32, pooling_factor=5.0) for i in range(8))))


def test_tables_whose_plan_space_lacks_data_parallel_are_never_replicated():
    replicated = NeuroShardSearch().search(REPLICABLE_TASK, _CommHeavy(), 0).data_parallel
    assert len(replicated) >= 2
    no_replicas = [_constrained(REPLICABLE_TASK.table(name), sharding_types=["table_wise", "column_wise", "row_wise"])
                   for name in replicated]
    task = REPLICABLE_TASK.model_copy(update={"tables": (
        *no_replicas, *(t for t in REPLICABLE_TASK.tables if t.name not in replicated))})
    plan = NeuroShardSearch().search(task, _CommHeavy(), 0)
    validate_plan(plan, task)
    assert not set(plan.data_parallel) & set(replicated)
    assert {s.table for s in plan.shards} >= set(replicated)


def test_tables_whose_plan_space_lacks_row_wise_are_never_split_by_rows():
    assert NeuroShardSearch().search(ROW_WISE_TASK, _PerIdCost(), 0).row_wise == ("hot",)
    hot = _constrained(ROW_WISE_TASK.table("hot"), sharding_types=["table_wise", "column_wise", "data_parallel"])
    task = _with_table(ROW_WISE_TASK, hot)
    plan = NeuroShardSearch().search(task, _PerIdCost(), 0)
    validate_plan(plan, task)
    assert plan.row_wise == () and sum(_slices(plan, "hot")) == 64


def test_a_table_too_big_for_columns_goes_row_wise_only_where_its_plan_space_allows():
    # as test_search_row_wise's: 4 columns, more rows than one device holds; a block of rows and 3 others fit
    rest = ROW_WISE_TASK.tables[1:]
    huge = TableSpec(name="huge", rows=4_000_000, dim=4, pooling_factor=2.0)
    cap = shard_memory_bytes([huge.row_block(0, 4), *rest[:3]], ROW_WISE_TASK.batch_size)
    task = ROW_WISE_TASK.model_copy(update={"tables": (huge, *rest), "device_memory_bytes": cap})
    assert "huge" in NeuroShardSearch().search(task, _PerIdCost(), 0).row_wise
    # wide enough to split by columns, but its plan space allows only the whole table or rows
    wide = TableSpec(name="huge", rows=1_000_000, dim=16, pooling_factor=2.0)
    task = task.model_copy(update={"tables": (wide, *rest)})
    rows_or_whole = _with_table(task, _constrained(wide, sharding_types=["table_wise", "row_wise"]))
    assert shard_memory_bytes([wide], task.batch_size) > cap
    plan = NeuroShardSearch().search(rows_or_whole, _PerIdCost(), 0)
    validate_plan(plan, rows_or_whole)
    assert "huge" in plan.row_wise
    whole_only = _with_table(task, _constrained(wide, sharding_types=["table_wise"]))
    with pytest.raises(PlanError, match="table 'huge': the table alone needs"):
        NeuroShardSearch().search(whole_only, _PerIdCost(), 0)
