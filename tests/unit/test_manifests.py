"""manifests/ (kustomize): valid against the Kubernetes schemas, complete, and consistent with the pipeline."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from shardwise.pipelines.pipeline import (
    CONFIG_MAP_KEYS,
    CONFIG_MAP_NAME,
    IMAGE,
    IMAGE_UID,
    MLFLOW_CLIENT_LABEL,
    SECRET_KEYS,
    SECRET_NAME,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -r requirements/dev.txt")

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
KUBERNETES_VERSION = "1.30.0"  # oldest Kubernetes the manifests promise to work on


def _kustomization() -> dict:
    return yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())


def _documents() -> list[tuple[str, dict]]:
    docs = []
    for name in _kustomization()["resources"]:
        for doc in yaml.safe_load_all((MANIFESTS / name).read_text()):
            if doc:
                docs.append((name, doc))
    return docs


def _by_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in _documents() if doc["kind"] == kind}


def _pod_specs() -> list[dict]:
    return [doc["spec"]["template"]["spec"] for _, doc in _documents() if doc["kind"] in ("Deployment", "StatefulSet")]


def _containers() -> list[dict]:
    return [c for spec in _pod_specs() for c in spec.get("initContainers", []) + spec["containers"]]


def _generated_secrets() -> dict[str, set[str]]:
    """secretGenerator's secrets and the keys of their committed templates (`<file>.example`)."""
    secrets = {}
    for generator in _kustomization()["secretGenerator"]:
        keys = set()
        for env_file in generator["envs"]:
            for line in (MANIFESTS / f"{env_file}.example").read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    keys.add(line.split("=", 1)[0])
        secrets[generator["name"]] = keys
    return secrets


def test_kustomization_lists_existing_files_and_every_manifest():
    resources = _kustomization()["resources"]
    for name in resources:
        assert (MANIFESTS / name).is_file(), f"kustomization.yaml lists missing file {name}"
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == set(resources), "every manifest is listed in kustomization.yaml"


@pytest.mark.parametrize(("source", "doc"), _documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_is_valid_against_kubernetes_schema(source, doc):
    # strict: unknown fields (typos such as `contianers`) are errors too
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_schema_validation_catches_a_typo():
    deployment = _by_kind("Deployment")["shardwise-mlflow"]
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["contianers"] = broken["spec"]["template"]["spec"].pop("containers")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_secret_and_config_map_the_pipeline_reads_exist_with_its_keys():
    assert set(SECRET_KEYS) <= _generated_secrets()[SECRET_NAME]
    config = _by_kind("ConfigMap")[CONFIG_MAP_NAME]
    assert set(CONFIG_MAP_KEYS) <= set(config["data"])


def test_every_referenced_secret_config_map_and_service_account_exists():
    secrets, config_maps = _generated_secrets(), set(_by_kind("ConfigMap"))
    accounts = set(_by_kind("ServiceAccount"))
    for spec in _pod_specs():
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts
    for container in _containers():
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                assert source["secretRef"]["name"] in secrets
            if "configMapRef" in source:
                assert source["configMapRef"]["name"] in config_maps
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets[ref["name"]], f"{container['name']}: {ref}"
    role = _by_kind("Role")["shardwise-pipeline-runner"]
    granted = {name for rule in role["rules"] for name in rule.get("resourceNames", [])}
    assert {SECRET_NAME, CONFIG_MAP_NAME} <= granted


def test_mlflow_uses_postgres_backend_and_s3_artifacts():
    (container,) = _by_kind("Deployment")["shardwise-mlflow"]["spec"]["template"]["spec"]["containers"]
    args = " ".join(container["args"])
    store = {v["name"]: v.get("value") for v in container["env"]}["MLFLOW_BACKEND_STORE_URI"]
    assert store.startswith("postgresql://") and "@shardwise-postgres:5432/" in store
    assert "--artifacts-destination=$(MLFLOW_ARTIFACTS_DESTINATION)" in args
    assert _by_kind("ConfigMap")[CONFIG_MAP_NAME]["data"]["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    assert "shardwise-postgres" in _by_kind("Service")
    tracking = _by_kind("ConfigMap")[CONFIG_MAP_NAME]["data"]["MLFLOW_TRACKING_URI"]
    assert tracking == "http://shardwise-mlflow:5000"
    assert "shardwise-mlflow" in _by_kind("Service")


def test_workloads_run_as_non_root_and_project_image_matches_pipeline():
    for spec in _pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False  # neither server talks to the Kubernetes API
    images = {c["image"] for c in _containers()}
    project = {i for i in images if i.startswith("ghcr.io/shardwise/")}
    assert project == {IMAGE}
    (override,) = _kustomization()["images"]
    assert f"{override['name']}:{override['newTag']}" == IMAGE
    mlflow = _by_kind("Deployment")["shardwise-mlflow"]["spec"]["template"]["spec"]
    assert mlflow["securityContext"]["runAsUser"] == IMAGE_UID


@pytest.mark.parametrize("container", _containers(), ids=lambda c: c["name"])
def test_every_container_is_locked_down(container):
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])  # the one scratch path, an emptyDir


def test_no_password_on_a_command_line_or_in_the_pod_spec():
    for container in _containers():
        command_line = " ".join(container.get("command", []) + container.get("args", []))
        assert "PASSWORD" not in command_line and "postgresql://" not in command_line, container["name"]
        env = container.get("env", [])
        for var in env:
            assert "password" not in var["name"].lower() or "valueFrom" in var, var
        # nor a variable holding it, expanded by a shell into a process argument (/proc/PID/cmdline)
        secret = [v["name"] for v in env if "valueFrom" in v or "PASSWORD" in v.get("value", "")]
        for name in secret:
            assert f"${name}" not in command_line and f"${{{name}}}" not in command_line, (container["name"], name)


def test_the_schema_upgrade_reads_the_store_from_the_environment_and_runs(tmp_path):
    """The init container's command, run here on a sqlite store: it creates MLflow's schema from the URI in its
    environment (on the cluster: postgresql://... composed from the secret)."""
    (init,) = [c for c in _containers() if c["name"] == "db-upgrade"]
    command = init["command"]
    assert command[0] == "python"
    store = tmp_path / "mlflow.db"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{store}"}
    done = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(store) as db:
        assert db.execute("select version_num from alembic_version").fetchone()


def test_placeholders_cannot_be_deployed():
    """Secrets come from git-ignored .env files: without them kustomize refuses to build; no CHANGE_ME anywhere."""
    for generator in _kustomization()["secretGenerator"]:
        for env_file in generator["envs"]:
            ignored = subprocess.run(["git", "check-ignore", "-q", str(MANIFESTS / env_file)], cwd=MANIFESTS)
            assert ignored.returncode == 0, f"{env_file} must be git-ignored (it holds real credentials)"
            assert (MANIFESTS / f"{env_file}.example").is_file()
    assert not _by_kind("Secret"), "secrets are generated from files, never committed"
    for path in MANIFESTS.rglob("*.yaml"):
        assert "CHANGE_ME" not in path.read_text(), path


def test_only_the_pipeline_reaches_mlflow_and_only_mlflow_reaches_postgres():
    policies = _by_kind("NetworkPolicy")
    mlflow = policies["shardwise-mlflow-clients"]["spec"]
    assert mlflow["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "shardwise-mlflow"}
    sources = [peer["podSelector"]["matchLabels"] for rule in mlflow["ingress"] for peer in rule["from"]]
    assert sources and all(s == {MLFLOW_CLIENT_LABEL: "true"} for s in sources)
    postgres = policies["shardwise-postgres-from-mlflow"]["spec"]
    (rule,) = postgres["ingress"]
    assert [p["podSelector"]["matchLabels"] for p in rule["from"]] == [{"app.kubernetes.io/name": "shardwise-mlflow"}]
    # every step of the compiled pipeline carries the label the policy admits, and runs as the image's user
    compiled = list(yaml.safe_load_all((MANIFESTS.parent / "pipelines" / "shardwise_pipeline.yaml").read_text()))
    executors = compiled[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors
    for name, executor in executors.items():
        assert executor["podMetadata"]["labels"][MLFLOW_CLIENT_LABEL] == "true", name
        assert executor["securityContext"]["runAsNonRoot"] is True, name


def test_mlflow_accepts_the_host_names_pipeline_steps_use_and_migrates_first():
    spec = _by_kind("Deployment")["shardwise-mlflow"]["spec"]["template"]["spec"]
    (server,) = spec["containers"]
    allowed = {v["name"]: v.get("value") for v in server["env"]}["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    tracking = urlparse(_by_kind("ConfigMap")[CONFIG_MAP_NAME]["data"]["MLFLOW_TRACKING_URI"])
    assert tracking.netloc in allowed and tracking.hostname in allowed
    for probe in (server["readinessProbe"], server["livenessProbe"]):  # the kubelet's Host is the pod IP
        (header,) = probe["httpGet"]["httpHeaders"]
        assert header["name"] == "Host" and header["value"] in allowed
    (upgrade,) = spec["initContainers"]
    assert "mlflow db upgrade" in " ".join(upgrade["command"])


def test_one_schedule_kfp_recurring_run_not_a_cron_job():
    assert not _by_kind("CronJob")
