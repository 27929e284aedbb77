"""manifests/ (kustomize): valid against the Kubernetes schemas, complete, and consistent with the pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardwise.pipelines.pipeline import CONFIG_MAP_KEYS, CONFIG_MAP_NAME, IMAGE, SECRET_KEYS, SECRET_NAME

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
    specs = []
    for _, doc in _documents():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            specs.append(doc["spec"]["template"]["spec"])
        elif doc["kind"] == "CronJob":
            specs.append(doc["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return specs


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
    secret = _by_kind("Secret")[SECRET_NAME]
    assert set(SECRET_KEYS) <= set(secret["stringData"])
    config = _by_kind("ConfigMap")[CONFIG_MAP_NAME]
    assert set(CONFIG_MAP_KEYS) <= set(config["data"])


def test_every_referenced_secret_config_map_and_service_account_exists():
    secrets, config_maps = set(_by_kind("Secret")), set(_by_kind("ConfigMap"))
    accounts = set(_by_kind("ServiceAccount"))
    for spec in _pod_specs():
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps
    role = _by_kind("Role")["shardwise-pipeline-runner"]
    granted = {name for rule in role["rules"] for name in rule.get("resourceNames", [])}
    assert {SECRET_NAME, CONFIG_MAP_NAME} <= granted


def test_mlflow_uses_postgres_backend_and_s3_artifacts():
    (container,) = _by_kind("Deployment")["shardwise-mlflow"]["spec"]["template"]["spec"]["containers"]
    args = " ".join(container["args"])
    assert "--backend-store-uri=postgresql://" in args and "@shardwise-postgres:5432/" in args
    assert "--artifacts-destination=$(MLFLOW_ARTIFACTS_DESTINATION)" in args
    assert _by_kind("ConfigMap")[CONFIG_MAP_NAME]["data"]["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://")
    assert "shardwise-postgres" in _by_kind("Service")
    tracking = _by_kind("ConfigMap")[CONFIG_MAP_NAME]["data"]["MLFLOW_TRACKING_URI"]
    assert tracking == "http://shardwise-mlflow:5000"
    assert "shardwise-mlflow" in _by_kind("Service")


def test_workloads_run_as_non_root_and_project_image_matches_pipeline():
    for spec in _pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True
    images = {c["image"] for spec in _pod_specs() for c in spec["containers"]}
    project = {i for i in images if i.startswith("ghcr.io/shardwise/")}
    assert project == {IMAGE}
    (override,) = _kustomization()["images"]
    assert f"{override['name']}:{override['newTag']}" == IMAGE


def test_recurring_run_submits_the_pipeline_on_a_schedule():
    cron = _by_kind("CronJob")["shardwise-recurring-run"]
    assert len(cron["spec"]["schedule"].split()) == 5
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["shardwise", "pipeline", "submit"]
    # its flags are ones the CLI accepts
    from shardwise.cli import build_parser

    args = build_parser("pipeline").parse_args([*container["command"][1:], *container["args"]])
    assert args.host.startswith("http://ml-pipeline.")
