"""The CI retraining workflow (.github/workflows/retrain.yml): it builds and pushes the image of the commit before it
submits, every step of the run uses that image, and nothing from the event or the secrets is pasted into a script."""

from __future__ import annotations

import re
from pathlib import Path

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
