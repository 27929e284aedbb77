"""`--containers` refuses, in one line and before any step, what it cannot run: no Docker engine, no image; and
it mounts only the run's folders and the MLflow store's."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.pipelines import containers


@dataclass
class _Done:
    returncode: int | str | None
    stderr: str


@pytest.fixture
def run_cli(monkeypatch, capsys) -> Callable[..., _Done]:
    """run_cli(*argv, cwd=, env=): `shardwise *argv` in this process, in `cwd` with `env` added to the
    environment: its exit status and stderr (a fresh interpreter a call cost a second importing kfp)."""

    def run(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> _Done:
        monkeypatch.chdir(cwd)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        try:
            code: int | str | None = main(list(argv))
        except SystemExit as exited:  # argparse's usage errors
            code = exited.code
        return _Done(code, capsys.readouterr().err)

    return run


def test_no_engine_is_one_line_and_nothing_runs(tmp_path, run_cli):
    done = run_cli("pipeline", "run", "--local", "--containers", "--preset", "smoke", "--workdir", "w", cwd=tmp_path,
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "no Docker engine answers" in done.stderr, done.stderr
    assert not (tmp_path / "w" / "pipeline_root").exists() and not (tmp_path / "mlflow.db").exists()


def test_an_image_not_built_is_named_with_how_to_build_it(tmp_path, run_cli):
    try:
        engine = subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        engine = False
    if not engine:
        pytest.skip("no Docker engine answers")
    done = run_cli("pipeline", "run", "--local", "--containers", "--image", "shardwise-no-such:0", "--preset",
                   "smoke", "--workdir", "w", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "image shardwise-no-such:0 is not on this machine" in done.stderr


def test_image_without_containers_is_a_usage_error(tmp_path, run_cli):
    done = run_cli("pipeline", "run", "--local", "--image", "x:1", "--preset", "smoke", cwd=tmp_path)
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
