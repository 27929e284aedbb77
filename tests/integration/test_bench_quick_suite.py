"""`make bench` stays green: each run of the quick suite (`python -m benchmarks --suite quick`), as the one command the
suite prints for it, run in an empty folder without an MLflow store (a fresh clone's conditions), exits 0. A run that
stops (an exception, a property it finds broken) fails here, in `make test-all`."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package, beside src/

from benchmarks import harness  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUICK = [(experiment, one) for experiment in harness.suite("quick") for one in experiment.suites["quick"]]


def test_the_quick_suite_has_runs():
    assert len(QUICK) >= 5, [e.name for e, _ in QUICK]  # make bench's five at least: none dropped out of the suite


@pytest.mark.parametrize("experiment, one", QUICK, ids=[one.record_name or e.name for e, one in QUICK])
def test_each_quick_suite_run_finishes(experiment, one, tmp_path):
    command = harness.suite_command(experiment, one)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "benchmarks"], command
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, f"{command}: exit {done.returncode}: {(done.stdout + done.stderr)[-3000:]}"
    assert f"== {experiment.name}: " in done.stdout and f"({experiment.name}: " in done.stdout, done.stdout[-2000:]
