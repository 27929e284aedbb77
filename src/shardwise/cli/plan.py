"""`shardwise plan`: method choices and each method's option flags come from the search-method registry;
`shardwise plan show URI` prints a registered plan (`shardwise publish` registers them)."""

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
    actions = parser.add_subparsers(dest="plan_action", required=False, metavar="show URI")
    show = actions.add_parser("show", help="print a registered plan (models:/shardwise-plan-<task>@champion, a "
                              "version, or its files' directory) with the figures it was registered on",
                              description="print a registered plan with the figures it was registered on")
    show.add_argument("uri", help="models:/shardwise-plan-<task>@<alias>, models:/<name>/<version>, or a directory")
    show.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (else $MLFLOW_TRACKING_URI, else "
                      "./mlflow.db)")
    show.set_defaults(handler=_show)


class _Shown(str):
    """A job result that is already text."""

    def summary(self) -> str:
        return str(self)


def _show(args: argparse.Namespace) -> _Shown:
    from shardwise.jobs import publish  # only this action needs the registry

    return _Shown(publish.show(args.uri, tracking_uri=args.tracking_uri))
