"""`shardwise train-policy`."""

from __future__ import annotations

import argparse

from shardwise.jobs import train_policy as job

from .options import add_config_option, add_settings_options, build_settings


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """Train a placement policy against a cost model; log and register it."""
    add_settings_options(parser, job.TrainPolicySettings, overrides={"method": {"choices": job.policy_methods()}})
    add_config_option(parser)
    parser.set_defaults(handler=lambda args: job.run(build_settings(job.TrainPolicySettings, args)))
