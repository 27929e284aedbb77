"""A local run's resume: the steps kfp.local serves from its cache are seen while it runs (its cache's lookups,
recorded) and linked into the new run folder, where the run's figures and plans are read as for a step that ran."""

from __future__ import annotations

from kfp import dsl
from kfp.local.cache import LocalCache

from shardwise.pipelines.run import _CacheHits, _link_cached_steps, _step_metadata


def _cached_step(tmp_path, cache_root, key: str, step: str):  # noqa: ANN001, ANN202 - a step the killed run finished
    made = tmp_path / "pipeline_root" / "killed-run" / step
    made.mkdir(parents=True)
    (made / "plan").write_text('{"format": "shardwise.plan/v1"}')
    LocalCache(str(cache_root)).put(key, {
        "plan": dsl.Artifact(name="plan", uri=str(made / "plan"), metadata={"predicted_ms": 3.5}),
        "Output": "a parameter, not an artifact"})


def test_every_cache_hit_is_recorded_while_the_run_lasts(tmp_path):
    cache = LocalCache(str(tmp_path / "step_cache"))
    cache.put("abcdef1234567890", {"Output": 1})
    hits = _CacheHits()
    with hits.recording():
        assert cache.get("abcdef1234567890") is not None
        assert cache.get("not-there") is None  # a miss is not a hit
    cache.get("abcdef1234567890")  # after the run: not recorded
    assert hits.keys == ["abcdef1234567890"]


def test_a_step_served_from_the_cache_is_linked_into_the_new_run(tmp_path):
    cache_root = tmp_path / "step_cache"
    _cached_step(tmp_path, cache_root, "abcdef1234567890", "search-plan-2")
    _cached_step(tmp_path, cache_root, "fedcba0987654321", "synth-workload")  # served, but not a step runs read
    run_dir = tmp_path / "pipeline_root" / "rerun"
    (run_dir / "pretrain-cost-model").mkdir(parents=True)  # a step that ran in the rerun stays as it is
    _link_cached_steps(run_dir, ["abcdef1234567890", "fedcba0987654321", "gone-from-the-cache"], cache_root)
    # the entry is the baseline plan's: its artifacts lie in the killed run's search-plan-2 folder
    assert (run_dir / "search-plan-2" / "plan").read_text() == '{"format": "shardwise.plan/v1"}'
    assert _step_metadata(run_dir, "search-plan-2", "plan") == {"predicted_ms": 3.5}
    assert list((run_dir / "pretrain-cost-model").iterdir()) == []
    assert not (run_dir / "search-plan").exists()  # not served from the cache: nothing to link
    assert not (run_dir / "synth-workload").exists()


def test_a_cached_profile_the_time_budget_cut_short_runs_again(tmp_path):
    cache = LocalCache(str(tmp_path / "step_cache"))
    for key, left in (("cut-short", 12.0), ("whole", 0.0)):
        costs = tmp_path / key / "costs"
        costs.mkdir(parents=True)
        cache.put(key, {"costs": dsl.Dataset(name="costs", uri=str(costs),
                                             metadata={"profiled_shards": 330.0, "profile_shards_left": left}),
                        "Output": "cpu-x86_64-2c"})
    hits = _CacheHits()
    with hits.recording():
        assert cache.get("cut-short") is None  # a miss: the step runs and resumes its store
        assert cache.get("whole") is not None
    assert hits.keys == ["whole"]
