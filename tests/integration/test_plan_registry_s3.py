"""The plan registry behind an MLflow tracking server whose artifacts live in S3 (moto's S3 server on loopback), as
deployed (manifests/mlflow.yaml: the server proxies artifacts, clients hold no S3 credentials): `shardwise publish`
registers a production task's plans there twice and gates `@champion`, each version's files land in the bucket and
not on the server's disk, and a training job's TorchRec planner loads the champion through `MlflowPlanLoader`, as
does `shardwise plan show`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import boto3
import pytest
from fault_injection import CLI, publish_argv
from moto.server import ThreadedMotoServer
from service_processes import mlflow_server

from shardwise.integrations.plan_registry import plan_name

pytestmark = pytest.mark.integration

BUCKET = "shardwise-plans"
TASK = "ranking-s3"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_tracking_server(tmp_path_factory):
    """(server URL, S3 client): `mlflow server` on loopback, sqlite backend, artifacts proxied to a bucket on moto's
    S3 server; only the server holds the bucket's credentials (conftest marks its tests slow)."""
    tmp = tmp_path_factory.mktemp("plans-s3")
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    try:
        with mlflow_server(tmp, artifacts=f"s3://{BUCKET}/mlartifacts",
                           env={**CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL": endpoint}) as url:
            yield url, s3
    finally:
        moto.stop()


def _client_env(tmp_path) -> dict[str, str]:
    """A client's environment: no S3 credentials or endpoint, its own model cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    return {**env, "SHARDWISE_CACHE": str(tmp_path / "client-cache")}


def test_publish_registers_plans_in_s3_and_a_training_job_loads_the_champion(s3_tracking_server, tmp_path):
    url, s3 = s3_tracking_server
    argv = publish_argv(tmp_path, TASK, url)
    env = _client_env(tmp_path)
    said = []
    for run in (1, 2):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"publish {run}: {done.stderr[-3000:]}"
        said.append(done.stdout)
    assert f"{plan_name(TASK)} v1 @champion" in said[0] and "no champion yet" in said[0], said[0]
    # the second plan measured beside the first in one session, gated on it
    assert f"{plan_name(TASK)} v2 @" in said[1] and "champion v1" in said[1], said[1]

    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="mlartifacts/").get("Contents", [])]
    for name in ("plan.json", "task.json", "figures.json", "torchrec_plan.json"):
        assert sum(k.endswith(f"/plan/{name}") for k in keys) == 2, (name, keys)  # one per version, in the bucket

    # a training job: TorchRec's planner with the loader, in a fresh process holding no S3 credentials
    job = subprocess.run([sys.executable, "-c", _TRAINING_JOB, str(tmp_path / "production.task.json"),
                          f"models:/{plan_name(TASK)}@champion", url], env=env, capture_output=True, text=True,
                         timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    loaded, registered = json.loads(job.stdout.strip().splitlines()[-1])
    assert loaded == registered and loaded, (loaded, registered)
    shown = subprocess.run([*CLI, "plan", "show", f"models:/{plan_name(TASK)}@champion", "--tracking-uri", url],
                           env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and shown.stdout.startswith(f"{plan_name(TASK)} v"), shown.stderr[-2000:]


#: a training job: the production task's model, topology, constraints and sharders rebuilt (as the job has them),
#: planned by TorchRec's planner with MlflowPlanLoader; prints [each table's ranks, the champion's torchrec ranks]
_TRAINING_JOB = """
import json, sys
from torchrec.distributed.planner import EmbeddingShardingPlanner
from shardwise.integrations.torchrec import MlflowPlanLoader, ShardwiseEnumerator
from shardwise.integrations.torchrec.context import load_production_task
task, uri, url = sys.argv[1:4]
context = load_production_task(task).context
topology, constraints = context.torchrec_topology(), context.torchrec_constraints()
enumerator = ShardwiseEnumerator(topology=topology, batch_size=context.batch_size, constraints=constraints)
loader = MlflowPlanLoader(uri, tracking_uri=url, enumerator=enumerator)
planner = EmbeddingShardingPlanner(topology=topology, batch_size=context.batch_size, constraints=constraints,
                                   enumerator=enumerator, plan_loader=loader,
                                   storage_reservation=context.torchrec_storage_reservation())
plan = planner.plan(context.module(), context.torchrec_sharders())
loaded = {t: list(p.ranks) for m in plan.plan.values() for t, p in m.items()}
registered = {o["name"]: [s["rank"] for s in o["shards"]] for o in loader.registered.torchrec["options"]}
print(json.dumps([loaded, registered]))
"""
