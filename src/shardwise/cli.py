"""The `shardwise` command: one verb per step of the method (profile, pretrain, plan, evaluate, ...)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shardwise import __version__



class CliError(Exception):
    """A user-facing failure: printed without a traceback, exit status 2."""


def _cmd_task_check(args: argparse.Namespace) -> int:
    from shardwise.workload import load_task, shard_memory_bytes

    task = load_task(args.file)
    total = shard_memory_bytes(task.tables, task.batch_size, task.optimizer, task.weights_precision)
    capacity = task.num_devices * task.device_memory_bytes
    print(
        f"{args.file}: ok ({len(task.tables)} tables, {task.num_devices} devices, batch {task.batch_size}, "
        f"memory {total / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB)"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every verb."""
    parser = argparse.ArgumentParser(
        prog="shardwise",
        description=(
            "Shard DLRM embedding tables across devices with a cost model pre-trained on real fbgemm "
            "kernels: profile -> augment -> pretrain -> plan -> evaluate."
        ),
    )
    parser.add_argument("--version", action="version", version=f"shardwise {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    task = verbs.add_parser("task", help="inspect sharding task files (shardwise.task/v1)")
    task_verbs = task.add_subparsers(dest="task_verb", metavar="ACTION", required=True)
    check = task_verbs.add_parser("check", help="validate a task file and print a summary")
    check.add_argument("file", help="path to a shardwise.task/v1 JSON file")
    check.set_defaults(handler=_cmd_task_check)

    # one `_add_<step>_verbs(verbs)` per step, each with its handlers (thin calls into the library)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `shardwise` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from shardwise.workload import TaskError

    try:
        return int(args.handler(args) or 0)
    except (CliError, TaskError, FileNotFoundError) as err:
        print(f"shardwise {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
