"""`shardwise publish`: plan production tasks, measure beside their champion plan and TorchRec's, register, gate."""

from __future__ import annotations

import argparse

from shardwise.jobs import publish as job

from .options import add_config_option, add_settings_options, build_settings


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """The publish settings' flags (measurement flags from MeasurementSettings)."""
    add_settings_options(parser, job.PublishSettings)
    add_config_option(parser)
    parser.set_defaults(handler=lambda args: job.run(build_settings(job.PublishSettings, args)))
