"""Command-line options generated from a job's settings model, so flags and settings cannot drift.

Each settings field becomes `--field-name` with the field's description as help and its default shown; a flag
not given is left out, so the settings model stays the only home of the default. `--config FILE.yaml` supplies
any field as data (flags override it). A field that is itself a settings model (MeasurementSettings) is
flattened into a group of its own fields.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from shardwise.errors import ShardwiseError

S = TypeVar("S", bound=BaseModel)
_NESTED = "."  # dest of a flattened field: "<field>.<nested field>"


class UsageError(ShardwiseError):
    """A command line that cannot be turned into settings (a missing flag, an option of another method)."""


def flag(name: str) -> str:
    """The command-line flag of a settings field."""
    return "--" + name.replace("_", "-")


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _show_default(field: FieldInfo) -> str:
    if field.is_required():
        return " (required)"
    default = field.get_default(call_default_factory=True)
    if default is None or default is False or default == () or default == {}:
        return ""
    if isinstance(default, tuple | list):
        default = " ".join(map(str, default))
    return f" (default: {default})"


def argument_kwargs(name: str, field: FieldInfo) -> dict[str, Any]:
    """argparse keyword arguments for one settings field (type, choices, repetition, help)."""
    annotation = _unwrap_optional(field.annotation)
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    kwargs: dict[str, Any] = {"help": (field.description or name.replace("_", " ")) + _show_default(field)}
    origin = typing.get_origin(annotation)
    if annotation is bool:
        # a setting that is on by default gets --no-<flag> to turn it off
        # (or that the job decides where not given, default None)
        kwargs["action"] = argparse.BooleanOptionalAction if field.default in (True, None) else "store_true"
        return kwargs
    if origin is Literal:
        choices = typing.get_args(annotation)
        return kwargs | {"choices": choices, "type": type(choices[0])}
    if origin in (tuple, list):
        item = typing.get_args(annotation)[0]
        if "sep" in extra:
            sep = str(extra["sep"])

            def split(text: str) -> list[Any]:
                return [item(part.strip()) for part in text.split(sep) if part.strip()]

            split.__name__ = f"{sep}-separated list"
            return kwargs | {"type": split}
        if "nargs" in extra:
            return kwargs | {"type": item, "nargs": extra["nargs"]}
        return kwargs | {"type": item, "action": "append"}
    if annotation in (int, float, str):
        return kwargs | {"type": annotation, "metavar": name.upper()}
    raise TypeError(f"settings field {name!r}: {field.annotation} has no command-line form")


def add_settings_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    settings_type: type[BaseModel],
    *,
    skip: Iterable[str] = (),
    positional: Iterable[str] = (),
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Add one option per field of `settings_type` (nested settings models as their own group)."""
    skip, positional, overrides = set(skip), set(positional), overrides or {}
    for name, field in settings_type.model_fields.items():
        if name in skip:
            continue
        annotation = _unwrap_optional(field.annotation)
        if _is_model(annotation):
            group = parser.add_argument_group(f"{name} ({annotation.__doc__ or ''}".split("\n")[0].rstrip() + ")")
            for sub, sub_field in annotation.model_fields.items():
                group.add_argument(flag(sub), dest=f"{name}{_NESTED}{sub}", default=argparse.SUPPRESS,
                                   **(argument_kwargs(sub, sub_field) | dict(overrides.get(sub, {}))))
            continue
        kwargs = argument_kwargs(name, field) | dict(overrides.get(name, {}))
        if name in positional:
            parser.add_argument(name, **kwargs)
        else:
            parser.add_argument(flag(name), dest=name, default=argparse.SUPPRESS, **kwargs)


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """`--config FILE.yaml`: any setting as data; flags override it."""
    parser.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE.yaml",
                        help="read settings from a YAML mapping (field names as keys); flags override it")


def read_config(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML settings file, keys normalised to field names."""
    import yaml  # only when a config file is given

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise UsageError(f"--config {path}: not a readable YAML file ({str(err).splitlines()[0]})") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UsageError(f"--config {path}: expected a mapping of setting names to values, got {type(doc).__name__}")
    return {str(k).replace("-", "_"): v for k, v in doc.items()}


def settings_values(settings_type: type[BaseModel], args: argparse.Namespace) -> dict[str, Any]:
    """The values of `settings_type`'s fields: the config file's, overridden by the flags given."""
    values: dict[str, Any] = read_config(args.config) if getattr(args, "config", None) else {}
    fields = settings_type.model_fields
    nested = {name: _unwrap_optional(f.annotation) for name, f in fields.items()
              if _is_model(_unwrap_optional(f.annotation))}
    for name, model in nested.items():  # a config may give nested fields flat: move them under their model
        moved = {k: values.pop(k) for k in list(values) if k in model.model_fields and k not in fields}
        if moved:
            values[name] = {**dict(values.get(name) or {}), **moved}
    unknown = sorted(k for k in values if k not in fields)
    if unknown:
        raise UsageError(f"--config {args.config}: {', '.join(map(repr, unknown))} not a setting here; settings: "
                         f"{', '.join(sorted(fields))}")
    for dest, value in vars(args).items():
        head, sep, sub = dest.partition(_NESTED)
        if sep and head in nested:
            values[head] = {**dict(values.get(head) or {}), sub: value}
        elif dest in fields:
            values[dest] = value
    return values


def build_settings(settings_type: type[S], args: argparse.Namespace, **fixed: Any) -> S:
    """Settings from the config file, the flags and `fixed` values; a missing required flag is named."""
    values = {**settings_values(settings_type, args), **fixed}
    missing = [flag(n) for n, f in settings_type.model_fields.items() if f.is_required() and n not in values]
    if missing:
        raise UsageError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")
    try:
        return settings_type.model_validate(values)
    except ValidationError as err:
        raise UsageError("; ".join(_describe(e) for e in err.errors())) from None


def _describe(error: Any) -> str:
    """`--num-devices: Input should be greater than or equal to 1` from one pydantic error."""
    names = [str(p) for p in error["loc"] if not isinstance(p, int)]
    message = error["msg"].removeprefix("Value error, ")
    if not names:  # a check across fields: its message names them
        return message
    where = flag(names[-1])
    given = error.get("input")
    if isinstance(given, int | float | str):
        where += f" {given}"
    return f"{where}: {message}"


Handler = Callable[[argparse.Namespace], Any]
