"""One harness for every benchmark: an experiment registers once, at the bottom of its own module, as a settings
model and one function that returns its rows and notes; the harness gives it flags made from the settings (as the
CLI does), quiet libraries, torch's threads, the cost model, one table renderer and records that are never
overwritten (record.py). Suites name which experiments run together, each with the settings it runs them with.

    python -m benchmarks --list                       # the experiments and the suites they are in
    python -m benchmarks NAME [flags] [--record [--record-name NAME]]
    python -m benchmarks --suite quick                # `make bench`: CPU minutes, no cost model needed
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from shardwise.cli.options import add_config_option, add_settings_options, build_settings, flag
from shardwise.errors import ShardwiseError

from . import record as records

#: suite -> what it is for
SUITES: dict[str, str] = {
    "quick": "CPU minutes on a fresh clone, no cost model needed: what `make bench` runs",
    "claims": "the runs behind the results page's claims (hours on a 2-core CPU, most with a cost model)",
    "gpu": "the whole method on one CUDA GPU (benchmarks/gpu_check.sh)",
}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: the test helpers an experiment may run at scale (fault scenarios, the independent memory check)
TEST_HELPERS = Path(__file__).resolve().parents[1] / "tests" / "unit"


class BenchmarkError(ShardwiseError):
    """An unknown experiment or suite, a duplicate registration, or a run that cannot go on as asked."""


class ExperimentSettings(BaseModel):
    """Base of an experiment's settings: frozen, unknown settings refused. Each field becomes a flag (its
    description the help); `model: str | None` is the cost model's URI, loaded by `Context.cost_model`."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class Outcome:
    """What one run of an experiment found: a table (one dict per row, same keys) and notes, one finding each."""

    rows: list[dict[str, Any]]
    notes: Sequence[str] = ()
    #: the record's name and title when this run is a variant (a smoke run); else the experiment's
    record_name: str | None = None
    title: str | None = None
    #: the run found what it checks broken (a property, a fault's rows lost): the harness exits 1
    failed: str | None = None


@dataclass
class Context:
    """What the harness hands a run: the cost models it loads or makes, each named in the record."""

    model: str | None = None

    def name_model(self, identity: str) -> None:
        """Name a cost model the run used (loaded, trained in the run, a stand-in) in its record, once."""
        named = self.model.split("; ") if self.model else []
        self.model = "; ".join(named if identity in named else [*named, identity])

    def cost_model(self, uri: str | None, *, required: bool = False) -> Any:
        """The cost model at `uri` (a directory, models:/ or runs:/), else this hardware's champion; None when
        absent and not required. The record names it with its registry version."""
        from shardwise.integrations.mlflow import MlflowService
        from shardwise.jobs.models import load_cost_model

        mlflow = MlflowService()
        model, used = load_cost_model(mlflow, uri, device=None, required=required)
        if used is not None:
            self.name_model(model_identity(mlflow, used))
        return model


def model_identity(mlflow: Any, uri: str) -> str:
    """`uri` as a record names it: a registered model with the version its alias pointed at, a directory as
    given."""
    match = re.fullmatch(r"models:/([^@/]+)@([^/]+)", uri)
    if not match:
        return uri
    name, alias = match.groups()
    try:
        found = mlflow.registered_version(name, alias=alias)
    except Exception:  # noqa: BLE001 - the identity is a label: an unreachable registry leaves the URI alone
        return uri
    return f"{uri} (version {found.version})"


@dataclass(frozen=True)
class SuiteRun:
    """One run of an experiment in a suite: its settings (field names to values, the rest default) and, for a
    variant of the experiment, the name it records under."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    record_name: str | None = None


@dataclass(frozen=True)
class Experiment:
    """One experiment as the harness knows it."""

    name: str
    #: what its table shows, one line: the record's title
    title: str
    settings: type[ExperimentSettings]
    #: run(settings, context) -> Outcome
    run: Callable[[Any, Context], Outcome]
    #: suite -> the runs of this experiment it makes
    suites: Mapping[str, tuple[SuiteRun, ...]] = field(default_factory=dict)
    #: torch's intra-op threads: one, as the profiler times kernels (None: torch's default)
    threads: int | None = 1

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise BenchmarkError(f"experiment name {self.name!r}: use lower-case letters, digits and '_'")
        if not (isinstance(self.settings, type) and issubclass(self.settings, ExperimentSettings)):
            raise BenchmarkError(f"experiment {self.name!r}: settings must subclass ExperimentSettings")
        for suite, runs in self.suites.items():
            if suite not in SUITES:
                raise BenchmarkError(f"experiment {self.name!r}: no suite {suite!r} (suites: {', '.join(SUITES)})")
            for one in runs:
                try:
                    self.settings.model_validate(dict(one.settings))
                except ValidationError as err:
                    first = err.errors()[0]
                    raise BenchmarkError(f"experiment {self.name!r}, suite {suite!r}: {flag(str(first['loc'][0]))}: "
                                         f"{first['msg']}") from None


_EXPERIMENTS: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Make `experiment` runnable by name; a second experiment of the same name is refused."""
    if experiment.name in _EXPERIMENTS and _EXPERIMENTS[experiment.name] is not experiment:
        raise BenchmarkError(f"experiment {experiment.name!r} is registered twice")
    _EXPERIMENTS[experiment.name] = experiment
    return experiment


def load_experiments() -> None:
    """Import every experiment module (each registers itself)."""
    importlib.import_module("benchmarks.experiments")


def names() -> list[str]:
    """The registered experiments, by name."""
    load_experiments()
    return sorted(_EXPERIMENTS)


def get(name: str) -> Experiment:
    """The experiment called `name`; an unknown name is an error listing them."""
    load_experiments()
    if name not in _EXPERIMENTS:
        raise BenchmarkError(f"no experiment {name!r}; experiments: {', '.join(sorted(_EXPERIMENTS))}")
    return _EXPERIMENTS[name]


def suite(name: str) -> list[Experiment]:
    """The experiments of suite `name`, by name."""
    if name not in SUITES:
        raise BenchmarkError(f"no suite {name!r}; suites: {', '.join(SUITES)}")
    return [_EXPERIMENTS[n] for n in names() if name in _EXPERIMENTS[n].suites]


def test_helpers(module: str) -> types.ModuleType:
    """A module of tests/unit that an experiment runs at scale (the suite's own checks, not a copy of them)."""
    if str(TEST_HELPERS) not in sys.path:
        sys.path.insert(0, str(TEST_HELPERS))
    return importlib.import_module(module)


def settings_argv(experiment: Experiment, values: Mapping[str, Any]) -> list[str]:
    """The flags that give `values` to `experiment`'s settings (a suite's run, as one command to repeat)."""
    argv = []
    for name, value in values.items():
        info = experiment.settings.model_fields[name]
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if isinstance(value, bool):
            if value != info.default:
                argv.append(flag(name) if value else "--no-" + flag(name)[2:])
        elif isinstance(value, tuple | list):
            if "sep" in extra:
                argv += [flag(name), str(extra["sep"]).join(map(str, value))]
            elif "nargs" in extra:
                argv += [flag(name), *map(str, value)]
            else:
                argv += [a for v in value for a in (flag(name), str(v))]
        elif value is not None:
            argv += [flag(name), str(value)]
    return argv


def prepare(threads: int | None) -> None:
    """Quiet libraries (as the CLI without -v) and torch's threads."""
    from shardwise.cli import quiet_libraries

    quiet_libraries(verbose=False)
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def run(experiment: Experiment, settings: ExperimentSettings, *, record: bool = False,
        record_name: str | None = None, command: str | None = None) -> Outcome:
    """Run one experiment: its table and notes printed, and with `record` a new record written."""
    prepare(experiment.threads)
    context = Context()
    print(f"== {experiment.name}: {experiment.title}", flush=True)
    started = time.perf_counter()
    outcome = experiment.run(settings, context)
    seconds = time.perf_counter() - started
    print("\n".join(["", *records.table(outcome.rows), "", *outcome.notes]))
    print(f"({experiment.name}: {seconds:.0f} s" + (f", cost model {context.model})" if context.model else ")"))
    if outcome.failed:
        print(f"{experiment.name} FAILED: {outcome.failed}", file=sys.stderr)
    if record:
        records.record(record_name or outcome.record_name or experiment.name, outcome.title or experiment.title,
                       outcome.rows, notes="; ".join(outcome.notes), model=context.model,
                       experiment=experiment.name, command=command or records.command_line())
    return outcome


def run_suite(name: str, *, record: bool = False) -> int:
    """Every experiment of suite `name` with the suite's settings, each whatever the others did; 1 if any failed."""
    runs = [(experiment, one) for experiment in suite(name) for one in experiment.suites[name]]
    failed, took = [], []
    for experiment, one in runs:
        command = suite_command(experiment, one, record=record)
        label = one.record_name or experiment.name
        print(f"\n$ {command}", flush=True)
        started = time.perf_counter()
        try:
            outcome = run(experiment, experiment.settings.model_validate(dict(one.settings)), record=record,
                          record_name=one.record_name, command=command)
            if outcome.failed:
                failed.append(label)
        except Exception:  # noqa: BLE001 - one run's failure is reported; the others still run
            traceback.print_exc()
            failed.append(label)
        took.append(f"{label} {time.perf_counter() - started:.0f} s")
    print(f"\nsuite {name}: {len(runs) - len(failed)} of {len(runs)} passed ({', '.join(took)})"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def suite_command(experiment: Experiment, one: SuiteRun, *, record: bool = False) -> str:
    """A suite's run as the one command that repeats it."""
    argv = [experiment.name, *settings_argv(experiment, one.settings)]
    if record:
        argv += ["--record", *(["--record-name", one.record_name] if one.record_name else [])]
    return "python -m benchmarks " + shlex.join(argv)


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks`'s parser: one subcommand per experiment, its flags from its settings."""
    load_experiments()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="the experiments and the suites they are in")
    parser.add_argument("--suite", choices=list(SUITES), help="; ".join(f"{k}: {v}" for k, v in SUITES.items()))
    parser.add_argument("--record", action="store_true", help="with --suite: record every run")
    commands = parser.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    for name in sorted(_EXPERIMENTS):
        experiment = _EXPERIMENTS[name]
        module = sys.modules[experiment.run.__module__]
        sub = commands.add_parser(name, help=experiment.title, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        add_settings_options(sub, experiment.settings)
        add_config_option(sub)
        sub.add_argument("--record", action="store_true",
                         help=f"write a new record under benchmarks/results/{name}/ (a smoke run: its own name)")
        sub.add_argument("--record-name", metavar="NAME", help="record under benchmarks/results/NAME/ instead")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks`: list, run one experiment, or run a suite; an error is one line and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.list:
            for name in sorted(_EXPERIMENTS):
                experiment = _EXPERIMENTS[name]
                print(f"{name:<22} {', '.join(experiment.suites) or '-':<18} {experiment.title}")
            return 0
        if args.suite:
            return run_suite(args.suite, record=args.record)
        if not args.experiment:
            parser.error("name an experiment, or give --suite or --list")
        experiment = _EXPERIMENTS[args.experiment]
        settings = build_settings(experiment.settings, args)
        outcome = run(experiment, settings, record=args.record, record_name=args.record_name,
                      command="python -m benchmarks " + shlex.join(argv))
        return 1 if outcome.failed else 0
    except ShardwiseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
