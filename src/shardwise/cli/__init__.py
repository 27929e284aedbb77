"""The `shardwise` command: thin adapters from the command line to jobs (`shardwise.jobs`), one module per
verb group. A verb's module (and what its job imports: torch, fbgemm, mlflow) loads only when that verb runs,
so `shardwise --help` and `shardwise task check` answer fast."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from shardwise.errors import ShardwiseError
from shardwise.extras import needs_extras
from shardwise.version import __version__

#: verb -> (module that configures its parser, one-line help), in the order of the method
VERBS: dict[str, tuple[str, str]] = {
    "task": ("shardwise.cli.task", "inspect sharding task files (shardwise.task/v1)"),
    "workload": ("shardwise.cli.workload", "DLRM tables (synthetic, or yours from a file), train/holdout splits, "
                 "sharding tasks"),
    "augment": ("shardwise.cli.workload", "NeuroShard augmentation: every dim, column halves, pooling resampling"),
    "profile": ("shardwise.cli.profile", "measure sampled shards on this machine's kernels -> cost dataset"),
    "pretrain": ("shardwise.cli.pretrain",
                 "train the cost model on cost datasets, evaluate on held-out tables, register in MLflow"),
    "train-policy": ("shardwise.cli.policy", "train a DreamShard/AutoShard placement policy on sampled tasks"),
    "plan": ("shardwise.cli.plan", "plan a task with any registered method -> shardwise.plan/v1; `plan show URI`: a "
             "registered plan"),
    "evaluate": ("shardwise.cli.evaluate", "measure plans' per-device cost on this machine's kernels"),
    "validate": ("shardwise.cli.evaluate", "train a TorchRec DLRM sharded by the plan(s); samples/s"),
    "benchmark": ("shardwise.cli.evaluate", "plan the papers' task sets with every method; measure all plans"),
    "publish": ("shardwise.cli.publish", "plan your models' tasks, measure beside their champion plan and TorchRec's, "
                "register in MLflow (shardwise-plan-<task>, @champion gated)"),
    "pipeline": ("shardwise.cli.pipeline", "the Kubeflow pipeline: compile, run locally, submit, schedule"),
}
DESCRIPTION = (
    "Shard DLRM embedding tables across devices with a cost model pre-trained on real fbgemm kernels: "
    "profile -> augment -> pretrain -> plan -> evaluate."
)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported like every other error: one line, exit 2 (the usage is in --help;
    subcommand parsers inherit this class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser with every verb listed; `verb`'s options (or every verb's, with "all") filled in."""
    parser = _Parser(prog="shardwise", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"shardwise {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a failure (default: one line); may follow the verb too")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the libraries' INFO logs (MLflow, torchrec, fbgemm); may follow the verb too")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, (module, help_) in VERBS.items():
        sub = verbs.add_parser(name, help=help_, description=help_)
        if verb in (name, "all"):
            importlib.import_module(module).configure(name, sub)
    return parser


def quiet_libraries(verbose: bool) -> None:
    """Library INFO logs (MLflow's store set-up and download bars, torchrec, fbgemm) only with -v."""
    level = "INFO" if verbose else "WARNING"
    # read by MLflow when it configures its loggers (at import) and by its artifact downloads
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", level)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true" if verbose else "false")
    for name in ("mlflow", "alembic", "torchrec", "fbgemm_gpu", "kfp"):
        logging.getLogger(name).setLevel(level)


def _selected_verb(argv: Sequence[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _printable_paths() -> None:
    """A path that is not valid UTF-8 (the OS hands it over as surrogate escapes) is printed escaped, as stderr
    already does, instead of failing the write on a terminal whose encoding is strict (an en_US.UTF-8 locale)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `shardwise` console script: a ShardwiseError (a missing extra among them) is one line on
    stderr and exit 2."""
    _printable_paths()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    verbose = bool({"-v", "--verbose"} & set(argv))
    argv = [arg for arg in argv if arg not in ("--debug", "-v", "--verbose")]
    quiet_libraries(verbose)
    args = build_parser(_selected_verb(argv)).parse_args(argv)
    args.verbose = verbose
    try:
        with needs_extras():  # an optional dependency imported deep inside a job: the extra to install
            result = args.handler(args)
    except ShardwiseError as err:
        if debug:
            traceback.print_exc()
        print(f"shardwise {args.verb}: error: {err}", file=sys.stderr)
        return err.exit_code
    if result is None:
        return 0
    for note in getattr(result, "notes", None) or ():
        print(f"shardwise {args.verb}: note: {note}", file=sys.stderr)
    print(result.summary())
    return 0
