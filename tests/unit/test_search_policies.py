"""What DreamShard and AutoShard share (PolicySearch): trained briefly against a small analytic cost model
(the cost model is not under test here), their plans fit, beat random on unseen tasks with other device
counts, respect tight memory, refuse impossible tasks, survive save/load, and are built by name from a policy
directory through the method registry."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from search_doubles import AnalyticCostModel, heldout_tasks, make_tables, make_task

from shardwise.search import (
    PlanError,
    PolicyError,
    PolicySearch,
    RandomSearch,
    get_method,
    load_policy_dir,
    make_searcher,
    simulate,
    train_policy,
    validate_plan,
)
from shardwise.search.autoshard import AutoShardConfig, AutoShardPolicy, train_autoshard
from shardwise.search.dreamshard import DreamShardConfig, DreamShardPolicy, train_dreamshard

torch.set_num_threads(1)

COST_MODEL = AnalyticCostModel()
#: method -> (train, config, how many history entries the config gives, policy class)
METHODS = {
    "dreamshard": (
        train_dreamshard,
        DreamShardConfig(hidden=32, iterations=3, episodes_per_iteration=10, rollouts=8, cost_steps=60,
                         initial_random_plans=24),
        lambda c: c.iterations, DreamShardPolicy,
    ),
    "autoshard": (
        train_autoshard, AutoShardConfig(hidden=32, episodes=40, rollouts=8),
        lambda c: c.episodes, AutoShardPolicy,
    ),
}


@pytest.fixture(scope="module", params=sorted(METHODS))
def method(request):
    train, config, history_len, policy_cls = METHODS[request.param]
    pool = make_tables(120, seed=0, prefix="train")
    rng = np.random.default_rng(1)
    tasks = [make_task([pool[j] for j in rng.choice(120, size=int(rng.integers(10, 21)), replace=False)], 3)
             for _ in range(8)]
    policy, history = train(COST_MODEL, tasks, seed=0, config=config, progress=False)
    assert len(history) == history_len(config)
    return request.param, policy, policy_cls


def test_plans_fit_and_beat_random_on_unseen_tasks_with_more_devices(method):
    name, trained, _ = method
    ours, random = [], []
    search = PolicySearch(trained)
    for seed, task in enumerate(heldout_tasks(4, num_tables=40, num_devices=5)):
        plan = search.search(task, COST_MODEL, seed=seed)
        validate_plan(plan, task)  # memory-feasible, every table placed once
        assert plan.method == name and plan.num_devices == 5
        ours.append(simulate(plan, task, COST_MODEL).max_cost_ms)
        random.append(np.mean([simulate(RandomSearch().search(task, None, s), task, COST_MODEL).max_cost_ms
                               for s in range(5)]))
    assert np.mean(ours) < 0.9 * np.mean(random)


def test_tight_memory_is_respected(method):
    _, trained, _ = method
    tables = make_tables(16, seed=11, prefix="tight")
    task = make_task(tables, num_devices=4, slack=1.05)
    plan = PolicySearch(trained, samples=4).search(task, COST_MODEL, seed=0)
    validate_plan(plan, task)
    assert max(plan.extra["memory_bytes"]) <= task.device_memory_bytes


def test_impossible_task_is_refused_naming_memory(method):
    _, trained, _ = method
    task = make_task(make_tables(10, seed=5, prefix="big"), num_devices=2, slack=0.5)
    with pytest.raises(PlanError, match="no plan fits"):
        PolicySearch(trained).search(task, COST_MODEL, seed=0)


def test_needs_a_cost_model(method):
    _, trained, _ = method
    with pytest.raises(PlanError, match="cost model"):
        PolicySearch(trained).search(heldout_tasks(1, 10, 2)[0], None, seed=0)


def test_save_load_gives_identical_plans(method, tmp_path):
    _, trained, policy_cls = method
    trained.save(tmp_path / "policy")
    assert (tmp_path / "policy" / "policy.json").is_file() and (tmp_path / "policy" / "weights.pt").is_file()
    loaded = policy_cls.load(tmp_path / "policy")
    for task in heldout_tasks(2, num_tables=30, num_devices=6):
        a = PolicySearch(trained, samples=3).search(task, COST_MODEL, seed=5)
        b = PolicySearch(loaded, samples=3).search(task, COST_MODEL, seed=5)
        assert a.shards == b.shards


def test_trained_policy_beats_the_untrained_one(method):
    name, trained, policy_cls = method
    config = METHODS[name][1]
    untrained = policy_cls(config, trained.cost_embedding_dim) if name == "dreamshard" else policy_cls(config)
    tasks = heldout_tasks(4, num_tables=30, num_devices=4)
    cost = {label: np.mean([simulate(PolicySearch(p).search(t, COST_MODEL, 0), t, COST_MODEL).max_cost_ms
                            for t in tasks]) for label, p in (("trained", trained), ("untrained", untrained))}
    assert cost["trained"] < cost["untrained"]


def test_registry_builds_the_method_from_a_policy_directory(method, tmp_path):
    name, trained, _ = method
    trained.save(tmp_path / "run" / "policy")  # a downloaded artifact tree keeps it one level down
    task = heldout_tasks(1, num_tables=20, num_devices=4)[0]
    by_name = make_searcher(name, policy=str(tmp_path / "run"), samples=2).search(task, COST_MODEL, seed=1)
    assert by_name.shards == PolicySearch(trained, samples=2).search(task, COST_MODEL, seed=1).shards
    assert load_policy_dir(tmp_path / "run").method == name
    spec = get_method(name)
    assert spec.policy is not None and spec.needs_cost_model and spec.learned


def test_without_a_policy_the_method_says_how_to_get_one(method):
    name = method[0]
    with pytest.raises(PlanError, match=f"shardwise train-policy --method {name}.*--policy"):
        make_searcher(name)


def test_another_methods_policy_is_refused_naming_both(method, tmp_path):
    name, trained, _ = method
    trained.save(tmp_path / "policy")
    other = "autoshard" if name == "dreamshard" else "dreamshard"
    with pytest.raises(PolicyError, match=f"a {name} policy, not a {other} one"):
        make_searcher(other, policy=str(tmp_path / "policy"))
    with pytest.raises(PolicyError, match="nowhere: no such directory"):
        make_searcher(name, policy=str(tmp_path / "nowhere"))
    with pytest.raises(PolicyError, match="a registry URI; searchers load a local policy directory"):
        make_searcher(name, policy=f"models:/shardwise-policy-{name}-cpu@champion")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyError, match="empty: no policy.json in it or below"):
        make_searcher(name, policy=str(tmp_path / "empty"))


def test_train_policy_dispatches_through_the_registry():
    tasks = heldout_tasks(1, num_tables=6, num_devices=2)
    policy, history = train_policy("autoshard", COST_MODEL, tasks, seed=0, episodes=2, progress=False)
    assert policy.method == "autoshard" and len(history) == 2
    with pytest.raises(ValueError, match="'neuroshard' plans without a trained policy"):
        train_policy("neuroshard", COST_MODEL, tasks, seed=0)


def _edit_policy_json(edit):
    def apply(directory):
        doc = json.loads((directory / "policy.json").read_text())
        edit(doc)
        (directory / "policy.json").write_text(json.dumps(doc))
    return apply


def _nan_weight(directory):
    state = torch.load(directory / "weights.pt")
    next(iter(state.values())).view(-1)[0] = float("nan")
    torch.save(state, directory / "weights.pt")


@pytest.mark.parametrize("damage, expected", [
    (_nan_weight, "NaN or infinite weights"),
    (lambda d: (d / "weights.pt").write_bytes(b"not a zip"), "cannot read the weights"),
    (_edit_policy_json(lambda doc: doc["config"].update(hidden=16)), "has shape"),
    (_edit_policy_json(lambda doc: doc["config"].update(bogus=1)), "bogus"),
    (_edit_policy_json(lambda doc: doc.update(config=[1, 2])), "expected a 'config' object"),
    (lambda d: (d / "policy.json").write_text("{"), "not valid JSON"),
], ids=["nan-weight", "not-a-zip", "shape-mismatch", "unknown-config-key", "config-not-object", "broken-json"])
def test_a_damaged_policy_is_refused_naming_the_directory(method, tmp_path, damage, expected):
    name, trained, _ = method
    trained.save(tmp_path / "policy")
    damage(tmp_path / "policy")
    with pytest.raises(PolicyError, match=expected) as err:
        make_searcher(name, policy=str(tmp_path / "policy"))
    assert "policy" in str(err.value) and "\n" not in str(err.value)
