"""The pipeline's steps in containers on this machine (`shardwise pipeline run --local --containers`).

kfp.local's Docker runner starts each step in the project's image, as a Kubeflow cluster does: the image's code,
not this checkout's; a read-only root filesystem, /tmp in memory, every capability dropped, no privilege
escalation, and no network unless a store is remote. What a step may touch is what the cluster gives it: its
declared inputs and outputs (the pipeline root) and the MLflow store. Here that store is a file, so its folder and
the artifact folders of its experiments are mounted at their own paths. Steps run as the calling user, so the
files they leave are the caller's. Without a GPU (no `nvidia-smi`) the default image is the CPU build
(`make image-cpu`): the CUDA build of fbgemm loads only where NVIDIA's driver is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kfp import local

from shardwise.errors import ShardwiseError
from shardwise.jobs.models import store_folders

from . import components

#: the CPU build of the project's image (`make image-cpu`)
CPU_IMAGE = f"{components.IMAGE}-cpu"
#: /dev/shm of a step: the all-to-all step's processes exchange tensors through it (the cluster mounts memory)
SHM_SIZE = "1g"
#: what a step reads from its environment besides the tracking URI: the object store's endpoint and credentials
#: (on the cluster, the config map's and the secret's)
PASSED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
              "AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL")


class ContainerError(ShardwiseError):
    """No Docker engine, or no image to run the steps in."""


def default_image() -> str:
    """The GPU image where NVIDIA's driver is, else its CPU build."""
    return components.IMAGE if shutil.which("nvidia-smi") else CPU_IMAGE


def _check_engine_and_image(image: str) -> None:
    """One line, before anything runs, when no engine answers or the image is not on this machine (kfp.local would
    try to pull it from a registry)."""
    from docker.client import from_env  # heavy, and only this mode needs it
    from docker.errors import DockerException, ImageNotFound

    try:
        client = from_env(timeout=15)
        try:
            client.images.get(image)
        finally:
            client.close()
    except ImageNotFound:
        how = "make image-cpu" if image == CPU_IMAGE else "make image"
        raise ContainerError(f"--containers: image {image} is not on this machine (build it: {how})") from None
    except DockerException as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise ContainerError(f"--containers: no Docker engine answers ({first}); start one (dockerd) "
                             "or run without --containers") from None


def _outermost(paths: list[Path]) -> list[Path]:
    """The paths not inside another of them (a mount covers what is under it)."""
    unique = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def docker_runner(workdir: Path, tracking_uri: str, *, image: str, remote_data: bool) -> local.DockerRunner:
    """kfp.local's Docker runner, set up as the cluster runs a step (see the module's text)."""
    from docker.types import DeviceRequest, Mount

    _check_engine_and_image(image)
    store = store_folders(tracking_uri)
    folders = [workdir, *store]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {
        "mounts": [Mount(target=str(f), source=str(f), type="bind") for f in _outermost(folders)],
        "working_dir": str(workdir),  # MLflow puts a new experiment's artifacts under ./mlruns: the workdir's
        "environment": {"MLFLOW_TRACKING_URI": tracking_uri, "HOME": "/tmp",
                        **{k: os.environ[k] for k in PASSED_ENV if k in os.environ}},
        "user": f"{os.getuid()}:{os.getgid()}",
        "read_only": True,
        "tmpfs": {"/tmp": ""},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "network_mode": "none" if store and not remote_data else "host",
        "shm_size": SHM_SIZE,
    }
    if image == components.IMAGE and shutil.which("nvidia-smi"):
        settings["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return local.DockerRunner(**settings)


@contextlib.contextmanager
def steps_in_image(image: str) -> Iterator[None]:
    """Every component's image set to `image` for the block (the components name the GPU image)."""
    specs = [getattr(components, name).component_spec.implementation.container for name in components.STEPS]
    saved = [spec.image for spec in specs]
    for spec in specs:
        spec.image = image
    try:
        yield
    finally:
        for spec, before in zip(specs, saved, strict=True):
            spec.image = before

