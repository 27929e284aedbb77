"""A registry, tracking server or object store that is down, hung, refusing or answering "no such model": one line
within the service timeout, naming the service and its host (credentials redacted), and "not found" only when a
server answered that. Real processes: a port nothing listens on, a port that never answers, a real `mlflow
server`, a tiny HTTP server answering 401/403/500, and moto's S3 server stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from moto.server import ThreadedMotoServer
from search_doubles import random_task
from service_processes import free_port, silent_server, status_server

from shardwise.cli import main
from shardwise.errors import ServiceError, ServiceUnauthorisedError, ServiceUnreachableError, ShardwiseError
from shardwise.integrations.mlflow import (
    MlflowService,
    RegistryError,
    champion_uri,
    cost_model_name,
    policy_name,
)
from shardwise.integrations.mlflow_registry import cache_root
from shardwise.profiling.dataset import count_rows
from shardwise.workload import save_task

pytestmark = pytest.mark.integration
SECRET = "s3cr3t-pw"
POLICY = policy_name("dreamshard", "cpu-itest")


@pytest.fixture
def task_file(tmp_path):
    return str(save_task(random_task(0, 8, 2), tmp_path / "task.json"))


def _plan(task_file: str, tmp_path: Path, uri: str, capsys, *extra: str) -> tuple[int, str, float]:
    """`shardwise plan` with the registry at `uri`: exit status, stderr, seconds."""
    capsys.readouterr()
    started = time.monotonic()
    code = main(["plan", "--task", task_file, "--out", str(tmp_path / "plan.json"), "--device", "cpu",
                 "--tracking-uri", uri, *extra])
    return code, capsys.readouterr().err, time.monotonic() - started


def test_a_port_nothing_listens_on_is_one_line_within_10_s_naming_the_registry(task_file, tmp_path, capsys):
    port = free_port()
    uri = f"http://alice:{SECRET}@127.0.0.1:{port}"
    code, err, seconds = _plan(task_file, tmp_path, uri, capsys)
    assert code == 2 and seconds < 10, (seconds, err)
    assert err.count("\n") == 1 and "unreachable" in err and f"127.0.0.1:{port}" in err
    assert "MLflow model registry" in err and SECRET not in err and "not in the registry" not in err
    code, err, seconds = _plan(task_file, tmp_path, uri, capsys, "--method", "dreamshard")
    assert code == 2 and seconds < 10 and "unreachable" in err and "no trained policy" not in err, err

    # MLflow's own calls (a run's artifacts, logging) are checked before its retries begin
    import mlflow  # noqa: F401 - imported before the clock starts: what is timed is the wait for the server

    service = MlflowService(uri)
    for call in (lambda: service.load("runs:/0123456789abcdef/policy", lambda d: d),
                 lambda: service.log_run(experiment="x", run_name="y", params={}, metrics={})):
        started = time.monotonic()
        with pytest.raises(ServiceUnreachableError) as caught:
            call()
        assert time.monotonic() - started < 10 and "MLflow tracking server" in str(caught.value)
        assert SECRET not in str(caught.value)


def test_a_server_that_never_answers_is_unreachable_after_the_timeout_setting(monkeypatch):
    monkeypatch.setenv("SHARDWISE_SERVICE_TIMEOUT_S", "0.5")
    with silent_server() as url:
        started = time.monotonic()
        with pytest.raises(ServiceUnreachableError, match=r"no answer within 0\.5 s") as caught:
            MlflowService(url).load_cost_model(champion_uri(cost_model_name("cpu")))
        assert 0.45 < time.monotonic() - started < 4
        assert url.removeprefix("http://") in str(caught.value)
    monkeypatch.setenv("SHARDWISE_SERVICE_TIMEOUT_S", "soon")
    with pytest.raises(ShardwiseError, match="SHARDWISE_SERVICE_TIMEOUT_S"):
        MlflowService("http://127.0.0.1:9").load_cost_model(champion_uri(cost_model_name("cpu")))


@pytest.mark.parametrize("status, body, error, words", [
    (401, b"You are not authenticated. Please see the documentation.", ServiceUnauthorisedError, "not authorised"),
    (403, b'{"error_code": "PERMISSION_DENIED", "message": "Permission denied"}', ServiceUnauthorisedError,
     "not authorised"),
    (500, b"Internal Server Error", ServiceError, "failed: HTTP 500"),
])
def test_a_server_refusing_or_failing_is_named_as_such_never_as_not_found(status, body, error, words, task_file,
                                                                          tmp_path, capsys):
    with status_server(status, body) as url:
        with pytest.raises(error) as caught:
            MlflowService(url).load(champion_uri(POLICY), lambda d: d)
        message = str(caught.value)
        assert words in message and url.removeprefix("http://") in message and "\n" not in message
        assert not isinstance(caught.value, RegistryError) and "not found" not in message
        code, err, seconds = _plan(task_file, tmp_path, url, capsys)
        assert code == 2 and words in err and "not in the registry" not in err and seconds < 10, err


@pytest.fixture
def server(mlflow_registry):
    """The URL of the run's shared `mlflow server` (conftest), started again if a fault test left it down."""
    if mlflow_registry.proc is None:
        mlflow_registry.start()
    return mlflow_registry.url


def _policy_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "policy.json").write_text(json.dumps({"format": "shardwise.policy/v1", "method": "dreamshard"}))
    torch.save({"w": torch.ones(2)}, root / "weights.pt")
    return root


def _cache_entries() -> list[str]:
    """The registry versions in this test's model cache (conftest's $SHARDWISE_CACHE), whole ones only."""
    return sorted(p.name for p in (cache_root() / "models").glob("*") if not p.name.startswith("."))


def test_a_real_server_answering_no_such_model_is_not_found(server, task_file, tmp_path, capsys):
    with pytest.raises(RegistryError, match="not found") as caught:
        MlflowService(server).load(champion_uri(POLICY), lambda d: d)
    assert server in str(caught.value) and "shardwise train-policy" in str(caught.value)
    code, err, _ = _plan(task_file, tmp_path, server, capsys)
    assert code == 2 and "not in the registry" in err and err.count("\n") == 1, err


def test_a_version_found_over_rest_is_cached_and_the_next_load_imports_no_mlflow(server, tmp_path):
    """The alias resolved with MLflow's REST API (urllib), the files from the cache: no MLflow in the process."""
    service = MlflowService(server)
    logged = service.log_policy(_policy_dir(tmp_path / "p"), method="dreamshard", hardware_kind="cpu-itest",
                                history=[], params={}, validation_cost=1.0)
    assert logged.promotion is not None
    assert _cache_entries() == []  # registering caches nothing: the first load below downloads (here, with MLflow)
    names = service.load(champion_uri(POLICY), lambda d: sorted(p.name for p in d.iterdir()))
    assert names == ["policy.json", "weights.pt"] and len(_cache_entries()) == 1
    # the next load, in a fresh interpreter (nothing imported yet), resolves the alias over REST and reads the cache
    code = ("import sys\n"
            "from shardwise.integrations.mlflow import MlflowService\n"
            "names = MlflowService(sys.argv[1]).load(sys.argv[2], lambda d: sorted(p.name for p in d.iterdir()))\n"
            "print(names, sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'requests', 'sqlalchemy'}))\n")
    run = subprocess.run([sys.executable, "-c", code, server, champion_uri(POLICY)], capture_output=True, text=True,
                         timeout=300, env=os.environ)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "['policy.json', 'weights.pt'] []"


def test_an_object_store_that_is_down_is_unreachable_quickly_naming_its_endpoint(monkeypatch):
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    moto.stop()  # the store goes away
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET,
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(ServiceUnreachableError) as caught:
        count_rows("s3://shardwise-costs/costs/cpu")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "unreachable" in message and f"{host}:{port}" in message and SECRET not in message and "\n" not in message
