"""`shardwise pretrain`."""

from __future__ import annotations

import argparse

from shardwise.jobs import pretrain as job

from .options import add_config_option, add_settings_options, build_settings


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """Train the cost model, evaluate it on held-out tables, register it in MLflow."""
    add_settings_options(parser, job.PretrainSettings)
    add_config_option(parser)
    parser.set_defaults(handler=lambda args: job.run(build_settings(job.PretrainSettings, args)))
