"""The optional extras (pyproject.toml's `[project.optional-dependencies]`) and the one error when one is missing.

`pip install shardwise` plans, trains and evaluates; the Kubeflow pipeline, the MLflow registry, the HTML reports'
plots and TorchRec each need an extra, and fbgemm's kernels (profile, evaluate, validate) the fbgemm build of this
torch: `fbgemm-gpu` beside a CUDA torch, `fbgemm-gpu-cpu` beside a CPU one, two packages no extra can choose
between. Code that needs one imports it where it is used; a missing one is a `MissingExtraError` (a ShardwiseError:
`shardwise` prints one line naming what to install and exits 2), made from Python's ModuleNotFoundError by
`import_extra`, `needs_extras` or `missing_extra`, or up front by `require` (a job that would otherwise fail only
after minutes of measuring)."""

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


#: the extras code imports lazily
EXTRAS = (
    Extra("pipeline", "the Kubeflow pipeline", {"kfp": "kfp", "kfp.kubernetes": "kfp-kubernetes"}),
    # boto3: MLflow's client for artifact stores on S3 (the registry's files); shardwise's own object-store
    # datasets go through pyarrow's S3 filesystem
    Extra("mlflow", "the MLflow tracking store and model registry",
          {"mlflow": "mlflow", "boto3": "boto3", "botocore": "boto3"}),
    Extra("report", "the plots of HTML reports", {"matplotlib": "matplotlib"}),
    # beside a CPU torch its install is its own (torchrec_install)
    Extra("torchrec", "TorchRec's planner and sharded models", {"torchrec": "torchrec"}),
)
#: fbgemm-gpu's release built against each torch minor version (the pairs requirements/cpu.txt and cuda.txt pin)
FBGEMM_FOR_TORCH = {"2.13": "1.8.0"}
#: torchrec's release built against each fbgemm-gpu release (requirements/torchrec.txt)
TORCHREC_FOR_FBGEMM = {"1.8.0": "1.8.0"}
#: torchrec's dependencies, installed before it where its own metadata would bring the CUDA fbgemm-gpu (pinned as
#: requirements/cpu.txt pins them: a newer tensordict asks for a newer torch)
TORCHREC_DEPENDENCIES = ("tensordict==0.15.3", "torchmetrics==1.0.3", "pyre-extensions==0.0.32", "iopath")


class MissingExtraError(ShardwiseError):
    """An optional dependency that is not installed: names it and what to install (`extra`: the extra that brings
    it, None for fbgemm's build, which is no extra)."""

    def __init__(self, package: str, purpose: str, install: str, extra: str | None = None) -> None:
        super().__init__(f"needs {package} for {purpose}, which is not installed: {install}")
        self.package = package
        self.extra = extra


def _torch_build() -> tuple[str, bool]:
    """This torch's version and whether it is a CUDA build."""
    import torch  # a base dependency: asked only when fbgemm or torchrec is missing

    return str(torch.__version__), torch.version.cuda is not None


def fbgemm_requirement(torch_version: str, cuda: bool) -> str:
    """The pip requirement of fbgemm's build for this torch: `fbgemm-gpu` beside a CUDA torch, `fbgemm-gpu-cpu`
    beside a CPU one, at the release built against its version."""
    package = "fbgemm-gpu" if cuda else "fbgemm-gpu-cpu"
    minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    release = FBGEMM_FOR_TORCH.get(minor)
    return f"{package}=={release}" if release else f"{package} (the release built for torch {minor})"


def missing_fbgemm(torch_version: str, cuda: bool) -> MissingExtraError:
    """fbgemm_gpu not installed: the build of this torch to install."""
    build = "CUDA" if cuda else "CPU"
    return MissingExtraError("fbgemm_gpu", "fbgemm's embedding kernels",
                             f"pip install {fbgemm_requirement(torch_version, cuda)} (fbgemm's {build} build, for "
                             f"this {build} torch {torch_version})")


def torchrec_install(torch_version: str, cuda: bool) -> str:
    """How to install TorchRec beside this torch: the extra beside a CUDA torch; beside a CPU one, fbgemm's CPU build
    and torchrec's dependencies first and torchrec without its own (its metadata asks for the CUDA fbgemm-gpu, which
    would replace the CPU build: docs/torchrec.md)."""
    if cuda:
        return 'pip install "shardwise[torchrec]"'
    fbgemm = fbgemm_requirement(torch_version, cuda=False)
    torchrec = TORCHREC_FOR_FBGEMM.get(fbgemm.partition("==")[2].partition(" ")[0])
    pinned = f"torchrec=={torchrec}" if torchrec else "torchrec"
    return (f"pip install {fbgemm.partition(' ')[0]} {' '.join(TORCHREC_DEPENDENCIES)}, then "
            f"pip install --no-deps {pinned} (beside a CPU torch; docs/torchrec.md)")


def _owner(module: str) -> tuple[Extra, str] | None:
    """The extra that brings `module` (or the package it is part of) and its pip name; None for any other."""
    for extra in EXTRAS:
        # the longest name first: kfp.kubernetes is its own package inside kfp's namespace
        for name in sorted(extra.modules, key=len, reverse=True):
            if module == name or module.startswith(f"{name}."):
                return extra, extra.modules[name]
    return None


def _missing(extra: Extra, package: str) -> MissingExtraError:
    install = (torchrec_install(*_torch_build()) if extra.name == "torchrec"
               else f'pip install "shardwise[{extra.name}]"')
    return MissingExtraError(package, extra.purpose, install, extra=extra.name)


def missing_extra(err: ModuleNotFoundError) -> MissingExtraError | None:
    """The one-line error for `err` when the missing module is one an extra brings, or fbgemm_gpu; None for any
    other."""
    name = err.name or ""
    if name == "fbgemm_gpu" or name.startswith("fbgemm_gpu."):
        return missing_fbgemm(*_torch_build())
    owner = _owner(name)
    return None if owner is None else _missing(*owner)


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
        raise _missing(extra, package)


def require_fbgemm() -> None:
    """The missing fbgemm build's error now when fbgemm_gpu is not installed (looked up, not imported): before
    minutes of work, or processes that would each fail importing it."""
    if find_spec("fbgemm_gpu") is None:
        raise missing_fbgemm(*_torch_build())
