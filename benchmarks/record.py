"""Where benchmark figures go: a run with `--record` writes one JSON document (the figures, the command that
produced them, the commit, the cost model, the machine and the date) to benchmarks/results/<name>/<stamp>.json,
a new file each time, never over an earlier one; `python benchmarks/make_results.py` renders docs/results.md from
the newest document of each name, so figures in docs always come from benchmark output."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FORMAT = "shardwise.benchmark-result/v2"
#: a record's file name: when it was written (UTC, so names sort in time), then the commit
STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}")
#: the folders whose changes move figures: a commit with edits under them is recorded as "<commit>-dirty"
CODE = ("src", "benchmarks")


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


def commit(root: Path = ROOT) -> str | None:
    """The checked-out commit, short, with "-dirty" where src/ or benchmarks/ differ from it; None outside git."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return None
    dirty = git("diff", "--quiet", "HEAD", "--", *CODE).returncode != 0
    return head.stdout.strip() + ("-dirty" if dirty else "")


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a shell would run it again from the repository root."""
    argv = sys.argv if argv is None else argv
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(argv[0]), *argv[1:]])


def record(name: str, title: str, rows: list[dict[str, Any]], *, notes: str = "", model: str | None = None,
           experiment: str | None = None, command: str | None = None, directory: Path = RESULTS,
           code: Path = ROOT) -> Path:
    """Write the figures of one run (a table: one dict per row, same keys) with what produced them, as a new file
    under `directory`/`name`/; `code`: the checkout that ran (its commit is recorded), where not this one."""
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"record name {name!r}: use lower-case letters, digits and '_'")
    now = dt.datetime.now(dt.timezone.utc)
    sha = commit(code)
    doc = {
        "format": FORMAT,
        "benchmark": name,
        "experiment": experiment,
        "title": title,
        "command": command or command_line(),
        "date": now.date().isoformat(),
        "commit": sha,
        "model": model,
        "machine": machine(),
        "rows": rows,
        "notes": notes,
    }
    folder = directory / name
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{now:%Y-%m-%dT%H%M%SZ}-{sha or 'no-commit'}"
    for n in range(1, 100):
        path = folder / (stem + (f"-{n}" if n > 1 else "") + ".json")
        try:
            with path.open("x") as out:  # "x": an earlier record of the same second is never overwritten
                out.write(json.dumps(doc, indent=1) + "\n")
            break
        except FileExistsError:
            continue
    print(f"recorded {path}")
    return path


def _written(path: Path) -> tuple[str, int]:
    """A record's place in time: its stamp, then the number a second record of the same second got."""
    again = re.search(r"-(\d{1,2})$", path.stem)  # commits are 7+ hex digits: a 1-2 digit tail is the number
    return (path.stem[: again.start()], int(again.group(1))) if again else (path.stem, 1)


def record_files(folder: Path) -> list[Path]:
    """The records in one name's folder, oldest first (other files there, a study's pieces, are not records)."""
    return sorted((p for p in folder.glob("*.json") if STAMP.match(p.name)), key=_written)


def newest_records(results: Path = RESULTS) -> dict[str, Path]:
    """Each record name's newest document."""
    found = {}
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        if files := record_files(folder):
            found[folder.name] = files[-1]
    return found


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a Markdown table (the console's and the results page's): columns in order of first appearance,
    a missing value shown as '-'."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    if not columns:
        return ["(no rows)"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return lines
