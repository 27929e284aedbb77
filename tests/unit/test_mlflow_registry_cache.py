"""The registry cache's keys, where it lives, and the service timeout setting (pure; the cache against a real
store and real servers is tests/integration/test_registry_cache.py and test_registry_faults.py)."""

from __future__ import annotations

import pytest

from shardwise.errors import ShardwiseError, service_timeout_s
from shardwise.integrations.mlflow_registry import ModelCache, RegisteredVersion, cache_root, registry_key


def test_registry_keys_name_the_store_itself_never_its_credentials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert registry_key("sqlite:///reg.db") == registry_key(f"sqlite:///{tmp_path / 'reg.db'}")  # the same file
    assert registry_key("sqlite:///reg.db") != registry_key("sqlite:///other.db")
    assert registry_key("http://alice:pw@Host:5000/") == registry_key("http://host:5000") == "http://host:5000"
    assert registry_key("http://host:5000") != registry_key("http://host:5001")
    assert registry_key("http://host:5000/a") != registry_key("http://host:5000/b")
    assert "pw" not in registry_key("postgresql://alice:pw@db/mlflow")


def test_two_registries_with_the_same_model_and_version_get_two_entries(tmp_path):
    cache = ModelCache(tmp_path)
    one, two = (RegisteredVersion(registry_key(uri), "shardwise-cost-cpu", "3", "models:/m-1", 1)
                for uri in ("sqlite:////a/mlflow.db", "http://tracking:5000"))
    assert cache.entry(one) != cache.entry(two)
    assert cache.entry(one).name.startswith("shardwise-cost-cpu-v3-") and cache.entry(one).parent == tmp_path / "models"
    assert cache.get(one) is None  # nothing written yet


def test_the_cache_lives_where_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDWISE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "shardwise"
    monkeypatch.setenv("SHARDWISE_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_the_service_timeout_defaults_to_10_s_and_refuses_nonsense(monkeypatch):
    monkeypatch.delenv("SHARDWISE_SERVICE_TIMEOUT_S", raising=False)
    assert service_timeout_s() == 10.0
    monkeypatch.setenv("SHARDWISE_SERVICE_TIMEOUT_S", "60")
    assert service_timeout_s() == 60.0
    for bad in ("0", "-1", "inf", "nan", "soon"):
        monkeypatch.setenv("SHARDWISE_SERVICE_TIMEOUT_S", bad)
        with pytest.raises(ShardwiseError, match="SHARDWISE_SERVICE_TIMEOUT_S"):
            service_timeout_s()
