"""Integration-test setup: registry versions a test downloads are cached in its own folder, not the user's."""

import pytest


@pytest.fixture(autouse=True)
def _model_cache(tmp_path, monkeypatch):
    """$SHARDWISE_CACHE in the test's tmp_path (subprocesses the test starts inherit it)."""
    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path / "shardwise-cache"))
