"""The CI retraining workflow (.github/workflows/retrain.yml): it builds and pushes the image of the commit before it
submits, every step of the run uses that image, and nothing from the event or the secrets is pasted into a script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).parents[2] / ".github" / "workflows" / "retrain.yml"


def _steps() -> list[dict]:
    (job,) = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    return job["steps"]


def test_the_image_of_the_commit_is_pushed_before_the_run_that_uses_it():
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert "${{ github.sha }}" in doc["env"]["IMAGE"] and doc["permissions"]["packages"] == "write"
    scripts = [s.get("run", "") for s in _steps()]
    build = next(i for i, s in enumerate(scripts) if "docker buildx build --push" in s)
    submit = next(i for i, s in enumerate(scripts) if "shardwise pipeline submit" in s)
    assert build < submit
    assert '--image "${IMAGE,,}"' in scripts[submit] and "--wait" in scripts[submit]
    # uploaded as the commit's version of one pipeline, so the Kubeflow UI shows what each run ran
    assert '--pipeline shardwise-retrain --pipeline-version "${GITHUB_SHA::8}"' in scripts[submit]
    assert '--tag "${IMAGE,,}"' in scripts[build]


def test_no_expression_is_pasted_into_a_script():
    """Event inputs and secrets reach scripts through `env:` only (a crafted input cannot inject shell)."""
    for step in _steps():
        assert not re.search(r"\$\{\{", step.get("run", "")), step.get("name")


# -- .ci/run, run with stand-ins for make, apt-get and id: what it installs and that it goes on where it cannot ------
CI_RUN = Path(__file__).parents[2] / ".ci" / "run"
#: stand-ins, each logging its command line; apt-get "installs" chromium into the same folder
STAND_INS = {
    "make": 'echo "make $*" >> "$CI_LOG"',
    "id": 'echo "$FAKE_UID"',
    "apt-get": 'echo "apt-get $*" >> "$CI_LOG"\n'
               'if [ "$1" = install ]; then [ -z "$APT_FAILS" ] || exit 100; '
               'printf "#!/bin/sh\\n" > "$(dirname "$0")/chromium"; chmod +x "$(dirname "$0")/chromium"; fi',
}


def _ci_run(tmp_path: Path, *, uid: int = 0, apt: bool = True, apt_fails: bool = False,
            chromium: bool = False) -> tuple[list[str], str]:
    """.ci/run in a copy of the repository's layout whose PATH holds only the stand-ins (and `dirname`): the commands
    it ran, in order, and its stderr."""
    import os
    import shutil
    import subprocess

    root, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (root / ".ci").mkdir(parents=True)
    (root / "scripts").mkdir()
    bin_dir.mkdir()
    shutil.copy(CI_RUN, root / ".ci" / "run")
    docker = root / "scripts" / "ci_docker.sh"
    docker.write_text('#!/bin/sh\necho "ci_docker" >> "$CI_LOG"\nexit 1\n')  # a machine without Docker
    docker.chmod(0o755)
    scripts = {**STAND_INS, **({"chromium": ":"} if chromium else {})}
    for name, body in scripts.items():
        if name == "apt-get" and not apt:
            continue
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for tool in ("dirname", "chmod"):  # what .ci/run and the apt-get stand-in use besides the shell's own
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    log = tmp_path / "ci.log"
    log.touch()
    env = {"PATH": str(bin_dir), "CI_LOG": str(log), "FAKE_UID": str(uid), "APT_FAILS": "1" if apt_fails else ""}
    done = subprocess.run([shutil.which("bash") or "/bin/bash", str(root / ".ci" / "run")], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert os.path.exists(bin_dir / "chromium") == (chromium or (apt and uid == 0 and not apt_fails))
    return log.read_text().splitlines(), done.stderr


def test_ci_installs_debians_chromium_before_the_tests_so_the_browser_test_runs(tmp_path):
    ran, stderr = _ci_run(tmp_path)
    assert ran == ["make setup", "ci_docker", "apt-get update -qq", "apt-get install -y -qq chromium", "make lint",
                   "make test-all"], ran
    assert stderr == ""


def test_ci_leaves_a_chromium_it_has_alone(tmp_path):
    ran, _ = _ci_run(tmp_path, chromium=True)
    assert not any(line.startswith("apt-get") for line in ran) and ran[-1] == "make test-all"


@pytest.mark.parametrize("case, words", [
    ({"uid": 1000}, "no root or apt-get"), ({"apt": False}, "no root or apt-get"),
    ({"apt_fails": True}, "apt-get could not install chromium")])
def test_ci_without_a_way_to_install_chromium_says_so_in_one_line_and_runs_every_test(tmp_path, case, words):
    ran, stderr = _ci_run(tmp_path, **case)
    assert ran[-2:] == ["make lint", "make test-all"], ran
    assert stderr.count("\n") == 1 and words in stderr and "browser test skips" in stderr, stderr
