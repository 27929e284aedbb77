"""Integration-test setup: registry versions a test downloads are cached in its own folder, not the user's; the
promotion gate does not wait for other runs where none can run."""

import pytest


@pytest.fixture(autouse=True)
def _model_cache(tmp_path, monkeypatch):
    """$SHARDWISE_CACHE in the test's tmp_path (subprocesses the test starts inherit it)."""
    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path / "shardwise-cache"))


@pytest.fixture(autouse=True)
def _gate_settles_at_once(monkeypatch):
    """The gate reads the alias back GATE_SETTLE_S (1 s) after moving it, for a run registering at the same moment
    to show itself: in this process nothing else registers, and the wait cost the tier a second a promotion (runs
    racing each other, in processes of their own, are the fault suite's: make test-all)."""
    from shardwise.integrations import promotion

    monkeypatch.setattr(promotion, "GATE_SETTLE_S", 0.0)
