"""`shardwise profile`."""

from __future__ import annotations

import argparse

from shardwise.jobs import profile as job

from .options import add_config_option, add_settings_options, build_settings


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """Measure sampled shards and all-to-all layouts into a Parquet cost dataset (resumable)."""
    add_settings_options(parser, job.ProfileJobSettings)
    add_config_option(parser)
    parser.set_defaults(handler=lambda args: job.run(build_settings(job.ProfileJobSettings, args)))
