import time

import numpy as np
import pytest
import torch
from search_doubles import FeatureCostModel, random_task

from shardwise.search import (
    NeuroShardConfig,
    NeuroShardSearch,
    PlanError,
    make_searcher,
    simulate,
    validate_plan,
)
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


def test_100_tables_on_8_devices_plans_in_under_2_seconds():
    task = random_task(1, 100, 8)
    started = time.perf_counter()
    NeuroShardSearch().search(task, FeatureCostModel(), 0)
    assert time.perf_counter() - started < 2.0


def test_bad_configs_and_missing_models_are_refused():
    with pytest.raises(ValueError, match="beam_width must be >= 1"):
        NeuroShardConfig(beam_width=0)
    with pytest.raises(ValueError, match="dim_cap_factors must be positive"):
        NeuroShardConfig(dim_cap_factors=(0.0,))
    with pytest.raises(PlanError, match="needs a cost model"):
        NeuroShardSearch().search(random_task(0, 5, 2), None, 0)


def test_search_flushes_subnormals_while_it_runs_and_restores_the_default_after():
    from shardwise.search.threads import single_thread

    subnormal = torch.tensor([torch.finfo(torch.float32).tiny / 4])
    threads = torch.get_num_threads()
    with single_thread():
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU cannot flush subnormals")
        assert torch.get_num_threads() == 1
        assert float(subnormal * 1.0) == 0.0  # a microcode assist each on many CPUs; worth nothing here
    assert float(subnormal * 1.0) > 0.0  # the rest of the process computes as before
    assert torch.get_num_threads() == threads
