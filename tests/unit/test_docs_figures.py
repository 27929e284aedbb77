"""The narrative docs (docs/DESIGN.md, docs/guide.md, docs/deploy.md, docs/torchrec.md) hold no measured figure
of their own: a benchmark's result is a link to the record that holds it, `[record](results.md#its-section)` or
`(results-archive.md#...)`, so a figure cannot drift from its record. Settings and definitions (a default, a target,
a format's example) are not results: the few that read like one are allowlisted below, each with why. Code spans
and fences are commands, formats and the lines a command prints, not figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NARRATIVE = [ROOT / "docs" / name for name in ("DESIGN.md", "guide.md", "deploy.md", "torchrec.md")]
PAGES = [ROOT / "docs" / name for name in ("results.md", "results-archive.md")]

#: a measured figure: a number with a unit of time, a share, a speed, a size or a speed-up, a 0.xxx / 1.xxx ratio
#: or correlation, or an outcome counted as "N of M"
FIGURE = re.compile(r"(?<![\w.])(?:"
                    r"\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?(?:x\b| ?(?:%|ms\b|s\b|shards/s\b|min\b|minutes?\b"
                    r"|seconds?\b|hours?\b|GB\b|GiB\b|MB\b|MiB\b))"
                    r"|[01]\.\d{2,}\b"
                    r"|\d+ of \d+\b)")
#: settings and definitions that read like figures: (the phrase as the doc writes it, why it is not a result)
ALLOWED = (
    ("default 10 s", "SHARDWISE_SERVICE_TIMEOUT_S's default, a setting"),
    ("load factors 0.1, 0.2 and 0.5", "the load factors the profiler times, a setting"),
    ("cache of 0.5, 0.2 or 0.1", "the load factors the memory fitter tries, a setting"),
    ("in the last 2 s", "the store's freshness window, a setting"),
    ("default to 2 s per table", "refinement's clock per table, a setting"),
    ("at least 30 s, at most 600 s", "refinement's clock's bounds, settings"),
    ("1.0-3.0x the feasibility floor", "the property test's memory range, a setting"),
    ("the 60 s target", "the planning-time target at 5,000 tables on 1,024 devices, a setting"),
    ("heavy-tailed, 4% empty", "the DLRM 2021 dataset's statistics that `synth` draws to, constants in its code"),
    ("0.47 / 0.15 / 0.14 / 0.11 / 0.07 / 0.03", "the same dataset's reuse shares, `synth`'s target"),
    ("1 GiB by default", "profile's --memory-cap-bytes default"),
    ("at most 64 MiB", "the cache flush buffer's cap, a setting"),
    ("a seeded 20% of sources", "pretrain's held-out share of sources, a setting"),
    ("rows x 0.001", "a profile's row scale, a setting"),
    ("row scale 0.01", "a task set's row scale, a setting"),
    ("at most 8 minutes of step limits", "the GPU check's step limits, settings"),
    ("H100 80GB HBM3", "the GPU's name"),
    ("EMA 0.99", "the weight average's decay that was tried, a setting"),
    ("1.30 schemas", "the Kubernetes version the manifests are validated against"),
    ("120 s by default", "publish's --refine-s default, a setting"),
    ("30 minutes by default", "torch.distributed's process-group timeout default, a setting"),
    ("a third of a 60 s group timeout", "the loader-ranks test's process-group timeout and bound, settings"),
    ("adapts first for 120 s", "DEFAULT_ADAPT_S, a setting"),
)
#: a link into a results page: the record's name, the page, the section's anchor if any
_LINK = re.compile(r"\[([^\]]*)\]\((results(?:-archive)?\.md)(?:#([^)\s]*))?\)")
_CODE = re.compile(r"^[ \t]*```.*?^[ \t]*```|`(?:[^`\n]|\n(?![ \t]*\n))+`", re.M | re.S)


def _anchor(title: str) -> str:
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def record_anchors(page: str) -> dict[str, str]:
    """Each record's name on a results page -> its section's anchor (GitHub's: repeats numbered), read from the
    page: a record's section opens with its `benchmarks/results/<name>/<file>.json` line."""
    seen: dict[str, int] = {}
    anchors, heading = {}, None
    for line in page.splitlines():
        if line.startswith("#"):
            base = _anchor(line.lstrip("#").strip())
            heading = base if base not in seen else f"{base}-{seen[base]}"
            seen[base] = seen.get(base, 0) + 1
        elif heading and (found := re.match(r"`benchmarks/results/(\w+)/[^`]+\.json`", line)):
            anchors[found.group(1)] = heading
            heading = None
    return anchors


def stray_figures(text: str) -> list[str]:
    """The figures in `text` outside a link's target, code and the allowlisted phrases, each with its line (a link's
    text is a record's name: a figure there counts)."""
    kept = _LINK.sub(lambda m: m.group()[:m.end(1) - m.start()] + " " * (m.end() - m.end(1)), text)
    kept = _CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), kept)
    allowed = [range(m.start(), m.end()) for phrase, _ in ALLOWED for m in re.finditer(re.escape(phrase), kept)]
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group()!r}" for m in FIGURE.finditer(kept)
            if not any(m.start() in span for span in allowed)]


def broken_links(text: str, pages: dict[str, dict[str, str]]) -> list[str]:
    """Links into the results pages whose anchor is no record's section there, or whose text is not that record."""
    broken = []
    for m in _LINK.finditer(text):
        name, page, anchor = m.groups()
        if anchor is not None and pages[page].get(name) != anchor:
            broken.append(f"{m.group()} (on {page}, {name!r} is at {pages[page].get(name)!r})")
    return broken


@pytest.fixture(scope="module")
def pages() -> dict[str, dict[str, str]]:
    return {page.name: record_anchors(page.read_text()) for page in PAGES}


@pytest.mark.parametrize("doc", NARRATIVE, ids=lambda doc: doc.name)
def test_narrative_doc_holds_no_figure_outside_a_record_link(doc):
    stray = stray_figures(doc.read_text())
    assert not stray, (f"{doc.name} holds measured figures; link the record instead, "
                       f"[name](results.md#section): {stray}")


@pytest.mark.parametrize("doc", NARRATIVE, ids=lambda doc: doc.name)
def test_narrative_doc_links_name_records_that_exist(doc, pages):
    assert not broken_links(doc.read_text(), pages)


def test_every_allowlisted_phrase_is_still_in_a_narrative_doc():
    text = "".join(doc.read_text() for doc in NARRATIVE)
    assert [phrase for phrase, _ in ALLOWED if phrase not in text] == []


def test_the_check_catches_figures_and_bad_links(pages):
    name, anchor = next(iter(pages["results.md"].items()))
    linked = f"Lower than TorchRec's estimator's: [{name}](results.md#{anchor}), with `--epochs 800`."
    assert stray_figures(linked) == [] and broken_links(linked, pages) == []
    for typed in ("held-out MAPE 4.26%", "took 20.4 s", "0.935 of TorchRec's", "21.8 shards/s", "1.6x faster",
                  "12 of 12 seeds", "in 3.3 s instead of 5.5 s"):
        assert stray_figures(f"The search {typed}, as measured.") != [], typed
    assert broken_links(f"[{name}](results.md#no-such-section)", pages) != []
    assert broken_links(f"[not_a_record](results.md#{anchor})", pages) != []
    assert stray_figures(f"[held-out MAPE 4.26%](results.md#{anchor})") != []
