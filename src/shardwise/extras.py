"""The optional extras (pyproject.toml's `[project.optional-dependencies]`) and the one error when one is missing.

`pip install shardwise` plans, profiles, trains and evaluates; the Kubeflow pipeline, the MLflow registry and the
HTML reports' plots each need an extra. Code that needs one imports it where it is used; a missing one is a
`MissingExtraError` (a ShardwiseError: `shardwise` prints one line naming the extra and exits 2), made from
Python's ModuleNotFoundError by `import_extra`, `needs_extras` or `missing_extra`, or up front by `require` (a job
that would otherwise fail only after minutes of measuring)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module
from importlib.util import find_spec
from types import ModuleType

from shardwise.errors import ShardwiseError


@dataclass(frozen=True)
class Extra:
    """One pip extra: what needs it (in the user's words, after "for") and the modules it brings (import name -> pip name),
    the one every use needs first."""

    name: str
    purpose: str
    modules: Mapping[str, str]


#: the extras code imports lazily (`[torchrec]` has its own CPU install steps: docs/torchrec.md)
EXTRAS = (
    Extra("pipeline", "the Kubeflow pipeline", {"kfp": "kfp", "kfp.kubernetes": "kfp-kubernetes"}),
    # boto3: MLflow's client for artifact stores on S3 (the registry's files); shardwise's own object-store
    # datasets go through pyarrow's S3 filesystem
    Extra("mlflow", "the MLflow tracking store and model registry",
          {"mlflow": "mlflow", "boto3": "boto3", "botocore": "boto3"}),
    Extra("report", "the plots of HTML reports", {"matplotlib": "matplotlib"}),
)


class MissingExtraError(ShardwiseError):
    """An optional dependency that is not installed: names it and the extra that brings it."""

    def __init__(self, extra: Extra, package: str) -> None:
        super().__init__(f"needs {package} for {extra.purpose}, which is not installed: "
                         f'pip install "shardwise[{extra.name}]"')
        self.extra = extra.name
        self.package = package


def _owner(module: str) -> tuple[Extra, str] | None:
    """The extra that brings `module` (or the package it is part of) and its pip name; None for any other."""
    for extra in EXTRAS:
        # the longest name first: kfp.kubernetes is its own package inside kfp's namespace
        for name in sorted(extra.modules, key=len, reverse=True):
            if module == name or module.startswith(f"{name}."):
                return extra, extra.modules[name]
    return None


def missing_extra(err: ModuleNotFoundError) -> MissingExtraError | None:
    """The one-line error for `err` when the missing module is one an extra brings; None for any other."""
    owner = _owner(err.name or "")
    return None if owner is None else MissingExtraError(*owner)


@contextmanager
def needs_extras() -> Iterator[None]:
    """A block whose imports of an extra's modules, when one is missing, raise MissingExtraError (from None:
    the message says it all); any other ModuleNotFoundError passes through."""
    try:
        yield
    except ModuleNotFoundError as err:
        missing = missing_extra(err)
        if missing is None:
            raise
        raise missing from None


def import_extra(module: str) -> ModuleType:
    """`import module` (one an extra brings), or MissingExtraError naming the extra to install."""
    with needs_extras():
        return import_module(module)


def require(name: str) -> None:
    """MissingExtraError now when extra `name`'s first module, the one every use of it needs, is not installed
    (looked up, not imported: cheap); the others are found missing where they are imported."""
    extra = next(e for e in EXTRAS if e.name == name)
    module, package = next(iter(extra.modules.items()))
    if find_spec(module) is None:
        raise MissingExtraError(extra, package)
