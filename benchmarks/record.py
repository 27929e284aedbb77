"""Where benchmark figures go: each benchmark's `--record` writes one JSON document (figures, the command that
produced them, the date and machine) to benchmarks/results/<name>.json; `python benchmarks/make_results.py`
renders docs/results.md from those documents, so figures in docs always come from benchmark output."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
FORMAT = "shardwise.benchmark-result/v1"


def machine() -> str:
    """A one-line description of this machine: CPU cores and model, GPU if any."""
    try:
        import torch  # noqa: PLC0415 - optional: the CLI benchmark runs without it

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        gpu = None
    cpu = platform.processor() or platform.machine()
    try:
        from shardwise.profiling.hardware import device_name  # noqa: PLC0415 - as torch: optional

        model = device_name("cpu")  # timings differ between CPU models
    except ImportError:
        model = cpu
    return f"{os.cpu_count()}-core {cpu}" + (f" ({model})" if model != cpu else "") + (f", {gpu}" if gpu else ", no GPU")


def record(name: str, title: str, rows: list[dict[str, Any]], *, notes: str = "", directory: Path = RESULTS) -> Path:
    """Write the figures of one benchmark run (a table: one dict per row, same keys) with its command and date."""
    doc = {
        "format": FORMAT,
        "benchmark": name,
        "title": title,
        "command": "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "rows": rows,
        "notes": notes,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"recorded {path}")
    return path
