"""`--containers` refuses, in one line and before any step, what it cannot run: no Docker engine, no image; and
it mounts only the run's folders and the MLflow store's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardwise.pipelines import containers


def _run(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "shardwise.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, **(env or {})})


def test_no_engine_is_one_line_and_nothing_runs(tmp_path):
    done = _run("pipeline", "run", "--local", "--containers", "--preset", "smoke", "--workdir", "w", cwd=tmp_path,
                env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "no Docker engine answers" in done.stderr, done.stderr
    assert not (tmp_path / "w" / "pipeline_root").exists() and not (tmp_path / "mlflow.db").exists()


def test_an_image_not_built_is_named_with_how_to_build_it(tmp_path):
    try:
        engine = subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        engine = False
    if not engine:
        pytest.skip("no Docker engine answers")
    done = _run("pipeline", "run", "--local", "--containers", "--image", "shardwise-no-such:0", "--preset", "smoke",
                "--workdir", "w", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "image shardwise-no-such:0 is not on this machine" in done.stderr


def test_image_without_containers_is_a_usage_error(tmp_path):
    done = _run("pipeline", "run", "--local", "--image", "x:1", "--preset", "smoke", cwd=tmp_path)
    assert done.returncode == 2 and "add --containers" in done.stderr


def test_mounts_are_the_outermost_folders():
    a, b, c = Path("/w/run"), Path("/w/run/mlruns"), Path("/store")
    assert set(containers._outermost([b, a, c, a])) == {a, c}


def test_steps_in_image_sets_every_component_and_restores_it():
    from shardwise.pipelines import components

    def images() -> set[str]:
        return {getattr(components, n).component_spec.implementation.container.image for n in components.STEPS}

    with containers.steps_in_image("local/x:1"):
        assert images() == {"local/x:1"}
    assert images() == {components.IMAGE}
