"""What the end-to-end pipeline runs share."""

from __future__ import annotations

import pytest


@pytest.fixture
def smoke_steps() -> set[str]:
    """The steps of the smoke preset's pipeline, each once. The loop's 2 profiling iterations show as one or two
    `profile-costs` lines: kfp.local reports them as their events arrive."""
    return {"make-workload", "augment-tables", "worker-slices", "profile-costs", "make-task", "profile-all-to-alls",
            "pretrain-cost-model", "search-plan", "search-plan-2", "train-policies", "evaluate-plans"}
