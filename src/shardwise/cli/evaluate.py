"""`shardwise evaluate`, `validate` and `benchmark`: plans measured on hardware."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from shardwise.jobs import benchmark, evaluate, validate
from shardwise.jobs.base import JobResult

from .options import add_config_option, add_settings_options, build_settings

#: verb -> (settings, job)
JOBS: dict[str, tuple[type[BaseModel], Callable[[Any], JobResult]]] = {
    "evaluate": (evaluate.EvaluateSettings, evaluate.run),
    "validate": (validate.ValidateSettings, validate.run),
    "benchmark": (benchmark.BenchmarkSettings, benchmark.run),
}


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """One of the three verbs; measurement flags come from MeasurementSettings."""
    settings_type, run = JOBS[verb]
    add_settings_options(parser, settings_type)
    add_config_option(parser)
    parser.set_defaults(handler=lambda args: run(build_settings(settings_type, args)))
