"""A trained placement policy on disk: `policy.json` (format, method, config, provenance) and `weights.pt`
(a state_dict: no pickled modules), versioned and checked on load."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardwise.errors import ShardwiseError

if TYPE_CHECKING:
    import torch

POLICY_FORMAT = "shardwise.policy/v1"
POLICY_FILE = "policy.json"
WEIGHTS_FILE = "weights.pt"


class PolicyError(ShardwiseError, ValueError):
    """A policy directory that is missing, malformed, or holds another method's policy."""


def save_policy(directory: str | Path, method: str, config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor],
                provenance: Mapping[str, Any] | None = None) -> Path:
    """Write `policy.json` (format, method, config, provenance) and `weights.pt` (a state_dict) into `directory`."""
    import torch  # here, not at the top: the search package's modules import without torch (`plan --help`)

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, directory / WEIGHTS_FILE)
    doc = {"format": POLICY_FORMAT, "method": method, "config": dict(config), "provenance": dict(provenance or {})}
    (directory / POLICY_FILE).write_text(json.dumps(doc, indent=1))
    return directory


def find_policy_dir(root: str | Path) -> Path:
    """`root` when it holds `policy.json`, else the first directory below it that does (a downloaded artifact
    tree keeps the policy one level down)."""
    root = Path(root)
    if (root / POLICY_FILE).is_file():
        return root
    found = sorted(p.parent for p in root.rglob(POLICY_FILE)) if root.is_dir() else []
    if not found:
        what = "no policy.json in it or below" if root.is_dir() else "no such directory"
        raise PolicyError(f"policy {root}: {what} (not a saved shardwise policy; train one with "
                          "`shardwise train-policy`)")
    return found[0]


def _policy_doc(directory: Path) -> dict[str, Any]:
    meta = directory / POLICY_FILE
    if not meta.is_file():
        raise PolicyError(f"{directory}: no {POLICY_FILE} (not a saved shardwise policy)")
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise PolicyError(f"{meta}: not valid JSON ({str(err)[:200]})") from None
    if not isinstance(doc, dict) or doc.get("format") != POLICY_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise PolicyError(f"{meta}: field 'format' must be {POLICY_FORMAT!r}, got {found!r}")
    return doc


def read_policy_method(directory: str | Path) -> str:
    """The method (e.g. "dreamshard") a saved policy belongs to."""
    return str(_policy_doc(Path(directory)).get("method"))


def read_policy(directory: str | Path, method: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """(config, state_dict, provenance) of a policy saved by `save_policy`; refuses another method's policy."""
    directory = Path(directory)
    doc = _policy_doc(directory)
    if doc.get("method") != method:
        raise PolicyError(f"{directory / POLICY_FILE}: field 'method' is {doc.get('method')!r}, expected {method!r}")
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise PolicyError(f"{directory}: no {WEIGHTS_FILE} beside {POLICY_FILE} (an incomplete policy directory)")
    import torch  # see save_policy

    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError... for a damaged file
        raise PolicyError(f"{weights}: cannot read the weights ({str(err).split('. ')[0][:200]})") from None
    if not isinstance(state, dict) or not isinstance(doc.get("config"), dict):
        raise PolicyError(f"{directory}: expected a 'config' object in {POLICY_FILE} and a dict of tensors in "
                          f"{WEIGHTS_FILE}, as `shardwise train-policy` writes them")
    return dict(doc["config"]), state, dict(doc.get("provenance") or {})


@contextmanager
def checked_policy(directory: str | Path) -> Iterator[None]:
    """Building a policy from its files: a config field or tensor that does not fit becomes a PolicyError
    naming the directory (wrap the config parsing and `load_checked_state` calls in it)."""
    try:
        yield
    except PolicyError:
        raise
    except KeyError as err:
        raise PolicyError(f"{directory}: field {err.args[0]!r} missing from {POLICY_FILE}'s config") from None
    except (TypeError, ValueError, RuntimeError) as err:
        raise PolicyError(f"{directory}: {str(err).splitlines()[0][:200] if str(err) else type(err).__name__} "
                          "(retrain with `shardwise train-policy`)") from None
