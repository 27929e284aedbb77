"""`shardwise plan`: method choices and each method's option flags come from the search-method registry."""

from __future__ import annotations

import argparse
from typing import Any

from shardwise.jobs import plan as job
from shardwise.profiling import MeasurementSettings
from shardwise.search import get_method, method_names

from .options import (
    UsageError,
    add_config_option,
    add_settings_options,
    argument_kwargs,
    build_settings,
    flag,
)

_OPTION = "option:"  # dest prefix of a method option


def _method_options() -> dict[str, tuple[list[str], Any]]:
    """Option name -> (methods that take it, its field), in registration order; filled in by jobs are left out."""
    options: dict[str, tuple[list[str], Any]] = {}
    for method in method_names():
        for name, field in get_method(method).options.model_fields.items():
            if field.annotation is MeasurementSettings:
                continue  # the job fills it in from --device
            options.setdefault(name, ([], field))[0].append(method)
    return options


def _plan(args: argparse.Namespace) -> job.PlanJobResult:
    given = {dest.removeprefix(_OPTION): value for dest, value in vars(args).items() if dest.startswith(_OPTION)}
    method = getattr(args, "method", None) or job.PlanSettings.model_fields["method"].default
    takes = get_method(method).options.model_fields
    for name in given:
        if name not in takes:
            owners = ", ".join(_method_options()[name][0])
            raise UsageError(f"{flag(name)} does not apply to --method {method} (it is an option of {owners})")
    return job.run(build_settings(job.PlanSettings, args, options=given))


def configure(verb: str, parser: argparse.ArgumentParser) -> None:
    """The plan settings' flags, then one group per set of methods sharing options."""
    methods = method_names()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # one method per line in the epilog
    parser.epilog = "methods:\n" + "\n".join(f"  {m:<20} {get_method(m).description}" for m in methods)
    add_settings_options(parser, job.PlanSettings, skip=["options"], overrides={"method": {"choices": methods}})
    add_config_option(parser)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, (owners, field) in _method_options().items():
        title = " / ".join(owners)
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        groups[title].add_argument(flag(name), dest=_OPTION + name, default=argparse.SUPPRESS,
                                   **argument_kwargs(name, field))
    parser.set_defaults(handler=_plan)
