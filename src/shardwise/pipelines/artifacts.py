"""What a pipeline step writes beside its outputs' metadata, so that a resumed local run can take it from the cache."""

from __future__ import annotations

import json
import os
from typing import Any


def write_metadata(artifact: Any) -> None:
    """An artifact that is only metadata (a `Metrics`, whose `log_metric` writes no file) written to its path as
    JSON: kfp.local's cache takes an entry whose artifact file is missing for a miss, so a step with such an output
    ran again on every resumed local run (pretraining and registering the model again, and every step after it)."""
    os.makedirs(os.path.dirname(artifact.path), exist_ok=True)
    with open(artifact.path, "w") as out:
        json.dump(artifact.metadata, out, sort_keys=True)
