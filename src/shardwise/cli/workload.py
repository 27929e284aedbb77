"""`shardwise workload synth|from|split|task` and `shardwise augment`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from shardwise.jobs import workload as job
from shardwise.jobs.base import JobResult

from .options import add_config_option, add_settings_options, build_settings

#: action -> (settings, job, help)
ACTIONS: dict[str, tuple[type[BaseModel], Callable[[Any], JobResult], str]] = {
    "synth": (job.SynthSettings, job.synth, "tables with the DLRM 2021 dataset's statistics + their index data"),
    "from": (job.GivenSettings, job.given,
             "your own tables: a tables file, or a DLRM dataset file's tables and index data (path or s3://)"),
    "split": (job.SplitSettings, job.split, "split a table file into train/holdout by source table"),
    "task": (job.TaskSettings, job.task, "sample a sharding task (shardwise.task/v1) from a table file"),
}


def _adapter(settings_type: type[BaseModel], run: Callable[[Any], JobResult]) -> Callable[[argparse.Namespace], JobResult]:
    return lambda args: run(build_settings(settings_type, args))


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """`workload ACTION` or `augment`."""
    if verb == "augment":
        add_settings_options(parser, job.AugmentSettings)
        add_config_option(parser)
        parser.set_defaults(handler=_adapter(job.AugmentSettings, job.augment))
        return
    actions = parser.add_subparsers(dest="workload_verb", metavar="ACTION", required=True)
    for name, (settings_type, run, help_) in ACTIONS.items():
        sub = actions.add_parser(name, help=help_, description=help_)
        add_settings_options(sub, settings_type)
        add_config_option(sub)
        sub.set_defaults(handler=_adapter(settings_type, run))
