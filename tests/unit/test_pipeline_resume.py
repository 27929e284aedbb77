"""A local run's resume: the steps kfp.local serves from its cache are seen while it runs (a filter on the root
logger, which kfp.local's logging keeps) and linked into the new run folder, where the run's figures and plans are
read as for a step that ran."""

from __future__ import annotations

import logging

from kfp import dsl
from kfp.local.cache import LocalCache
from kfp.local.logging_utils import local_logger_context

from shardwise.pipelines.run import _CacheHits, _link_cached_steps, _step_metadata


def test_a_cache_hit_is_seen_while_kfp_local_owns_the_logging():
    hits = _CacheHits()
    logging.getLogger().addFilter(hits)
    try:
        with local_logger_context():  # kfp.local's: swaps the root logger's handlers for its own
            logging.info("Task search-plan cache hit (key=abcdef123456); skipping execution.")
            logging.info("Executing task 'evaluate-plans'")
    finally:
        logging.getLogger().removeFilter(hits)
    assert hits.keys == {"search-plan": "abcdef123456"}


def test_a_step_served_from_the_cache_is_linked_into_the_new_run(tmp_path):
    made = tmp_path / "pipeline_root" / "killed-run" / "search-plan"
    made.mkdir(parents=True)
    (made / "plan").write_text('{"format": "shardwise.plan/v1"}')
    cache_root = tmp_path / "step_cache"
    LocalCache(str(cache_root)).put("abcdef1234567890", {
        "plan": dsl.Artifact(name="plan", uri=str(made / "plan"), metadata={"predicted_ms": 3.5}),
        "Output": "a parameter, not an artifact"})
    run_dir = tmp_path / "pipeline_root" / "rerun"
    (run_dir / "pretrain-cost-model").mkdir(parents=True)  # a step that ran in the rerun stays as it is
    _link_cached_steps(run_dir, {"search-plan": "abcdef123456", "pretrain-cost-model": "0123456789ab"}, cache_root)
    assert (run_dir / "search-plan" / "plan").read_text() == '{"format": "shardwise.plan/v1"}'
    assert _step_metadata(run_dir, "search-plan", "plan") == {"predicted_ms": 3.5}
    assert list((run_dir / "pretrain-cost-model").iterdir()) == []
    assert not (run_dir / "search-plan-2").exists()  # not served from the cache: nothing to link
