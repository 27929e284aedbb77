"""The GPU image as the cluster runs it: its non-root user, a read-only root filesystem, a writable output folder.
Skipped where no Docker engine answers or the image is not built (`make image`; CI builds none: it is several GB).
The CPU build (`make image-cpu`, tag ...-cpu) profiles without a driver.

    SHARDWISE_IMAGE=ghcr.io/shardwise/shardwise:0.1.0-cpu python -m pytest tests/integration/test_image.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shardwise.pipelines.components import IMAGE
from shardwise.pipelines.containers import CPU_IMAGE

pytestmark = pytest.mark.integration

def _engine_and_image() -> tuple[str, str | None]:
    """The image to test ($SHARDWISE_IMAGE, else the GPU image, else its CPU build) and why the smoke test cannot
    run here (None when it can)."""
    wanted = [os.environ["SHARDWISE_IMAGE"]] if "SHARDWISE_IMAGE" in os.environ else [IMAGE, CPU_IMAGE]
    if shutil.which("docker") is None:
        return wanted[0], "no docker client"
    try:
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return wanted[0], "the Docker engine does not answer"
    if info.returncode != 0:
        return wanted[0], "no Docker engine running"
    for tag in wanted:
        if subprocess.run(["docker", "image", "inspect", tag], capture_output=True, timeout=30).returncode == 0:
            return tag, None
    return wanted[0], f"image {' or '.join(wanted)} not built (make image, make image-cpu)"


TAG, SKIP = _engine_and_image()


def _run(out: Path, *command: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """`command` in the image as the cluster runs it: non-root, read-only root, /tmp in memory, /out writable."""
    gpus = ["--gpus", "all"] if shutil.which("nvidia-smi") else []
    return subprocess.run(
        ["docker", "run", "--rm", *gpus, "--read-only", "--tmpfs", "/tmp", "--user", "10001", "--network", "none",
         "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "-v", f"{out}:/out", "-w", "/out",
         "-e", "MLFLOW_TRACKING_URI=sqlite:////out/mlflow.db", TAG, *command],
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
def test_the_image_runs_the_cli_and_a_plan_read_only_as_its_user_and_profiles_where_a_driver_is(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the image's user (uid 10001) writes here

    version = _run(out, "shardwise", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("shardwise ")

    whoami = _run(out, "python", "-c", "import os; print(os.getuid())")
    assert whoami.stdout.strip() == "10001"

    steps = [
        ("shardwise", "workload", "synth", "--num-tables", "12", "--row-scale", "0.0005", "--batch-size", "256",
         "--out", "/out/tables"),
        ("shardwise", "workload", "task", "--tables", "/out/tables/tables.json", "--num-tables", "8",
         "--num-devices", "2", "--out", "/out/task.json"),
        ("shardwise", "plan", "--task", "/out/task.json", "--method", "size_greedy", "--out", "/out/plan.json"),
    ]
    for step in steps:
        done = _run(out, *step)
        assert done.returncode == 0, f"{' '.join(step[:2])}: {done.stderr[-2000:]}"
    plan = json.loads((out / "plan.json").read_text())
    assert plan["format"] == "shardwise.plan/v1" and plan["num_devices"] == 2

    # the image's fbgemm is the CUDA build: it loads only where the NVIDIA driver's libraries are (GPU nodes);
    # without them, profiling says so in one line instead of a loader traceback
    profile = _run(out, "shardwise", "profile", "--tables", "/out/tables/tables.json", "--num-shards", "4",
                   "--comm-layouts", "0", "--timing-iters", "2", "--device", "cpu", "--out", "/out/costs")
    if shutil.which("nvidia-smi") is None and not TAG.endswith("-cpu"):
        assert profile.returncode == 2, profile.stderr[-2000:]
        assert profile.stderr.count("\n") == 1 and "needs an NVIDIA driver" in profile.stderr
    else:
        assert profile.returncode == 0, profile.stderr[-2000:]
