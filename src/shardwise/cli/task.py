"""`shardwise task check FILE`."""

from __future__ import annotations

import argparse

from shardwise.jobs import task as job

from .options import add_settings_options, build_settings


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """`task check`: validate a task file and print a summary."""
    actions = parser.add_subparsers(dest="task_verb", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a task file and print a summary")
    add_settings_options(check, job.CheckSettings, positional=["file"])
    check.set_defaults(handler=lambda args: job.check(build_settings(job.CheckSettings, args)))
