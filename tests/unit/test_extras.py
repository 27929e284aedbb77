"""A missing optional extra is one line naming what to install (exit 2), never a traceback: the pipeline (kfp),
the registry (mlflow), the reports (matplotlib), TorchRec, and fbgemm's build of this torch for its kernels.
`sys.modules[name] = None` makes `import name` fail as if the package were not installed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from search_doubles import random_task

from shardwise.cli import main
from shardwise.errors import ShardwiseError
from shardwise.extras import (
    FBGEMM_FOR_TORCH,
    TORCHREC_DEPENDENCIES,
    TORCHREC_FOR_FBGEMM,
    MissingExtraError,
    fbgemm_requirement,
    import_extra,
    missing_extra,
    missing_fbgemm,
    require,
    torchrec_install,
)
from shardwise.integrations.mlflow import MlflowService
from shardwise.workload import save_task

PIPELINE_LINE = ('shardwise pipeline: error: needs kfp for the Kubeflow pipeline, which is not installed: '
                 'pip install "shardwise[pipeline]"')
MLFLOW_MESSAGE = ('needs mlflow for the MLflow tracking store and model registry, which is not installed: '
                  'pip install "shardwise[mlflow]"')


#: shardwise's modules that import an extra at their top: imported afresh while it is missing
_IMPORTERS = ("shardwise.pipelines.run", "shardwise.pipelines.pipeline", "shardwise.pipelines.components",
              "shardwise.pipelines.containers", "shardwise.integrations.mlflow_pyfunc")


def _uninstalled(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """`names` (and their submodules already imported) not importable, as if not installed; shardwise's modules
    that import them at their top to be imported afresh."""
    for name in names:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")] + [name]:
            monkeypatch.setitem(sys.modules, module, None)
    for module in _IMPORTERS:
        monkeypatch.delitem(sys.modules, module, raising=False)
        parent, _, child = module.rpartition(".")
        if parent in sys.modules:  # `from package import module` takes the package's attribute when it has one
            monkeypatch.delattr(sys.modules[parent], child, raising=False)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("argv", [["pipeline", "compile", "--out", "p.yaml"],
                                  ["pipeline", "run", "--local", "--workdir", "w"]])
def test_the_pipeline_without_kfp_says_to_install_the_pipeline_extra(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _uninstalled(monkeypatch, "kfp")
    assert main(argv) == 2
    assert _one_line(capsys) == PIPELINE_LINE
    assert not (tmp_path / "p.yaml").exists()


def test_kfp_without_kfp_kubernetes_names_kfp_kubernetes():
    missing = missing_extra(ModuleNotFoundError("No module named 'kfp.kubernetes'", name="kfp.kubernetes"))
    assert missing is not None and missing.extra == "pipeline" and missing.package == "kfp-kubernetes"
    assert str(missing).endswith('pip install "shardwise[pipeline]"')


def test_the_registry_without_mlflow_says_to_install_the_mlflow_extra(tmp_path, monkeypatch):
    _uninstalled(monkeypatch, "mlflow")
    service = MlflowService(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(MissingExtraError) as raised:
        service.log_run(experiment="e", run_name="r", params={}, metrics={})
    assert str(raised.value) == MLFLOW_MESSAGE
    assert isinstance(raised.value, ShardwiseError) and raised.value.__cause__ is None


def test_plan_with_a_registry_uri_without_mlflow_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _uninstalled(monkeypatch, "mlflow")
    save_task(random_task(0, 8, 4), "task.json")
    (tmp_path / "mlflow.db").touch()  # a store that exists: only MLflow reads a runs:/ URI from it
    argv = ["plan", "--task", "task.json", "--model", "runs:/0123456789abcdef/cost_model",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--out", "plan.json"]
    assert main(argv) == 2
    assert _one_line(capsys) == f"shardwise plan: error: {MLFLOW_MESSAGE}"
    assert not (tmp_path / "plan.json").exists()


def test_pretrain_that_would_register_without_mlflow_stops_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _uninstalled(monkeypatch, "mlflow")
    # the data does not exist: the missing extra is said before anything is read or trained
    assert main(["pretrain", "--data", "costs.parquet", "--out", "model"]) == 2
    assert _one_line(capsys) == f"shardwise pretrain: error: {MLFLOW_MESSAGE}"


def test_reports_without_matplotlib_say_to_install_the_report_extra(monkeypatch):
    _uninstalled(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtraError, match=r'needs matplotlib .*pip install "shardwise\[report\]"$'):
        require("report")
    with pytest.raises(MissingExtraError, match=r"shardwise\[report\]"):
        import_extra("matplotlib.pyplot")


def test_a_module_no_extra_brings_is_left_as_python_raised_it():
    # a database driver MLflow needs is its own message (mlflow_process.open_client), not an extra
    assert missing_extra(ModuleNotFoundError("No module named 'psycopg2'", name="psycopg2")) is None
    assert missing_extra(ModuleNotFoundError("No module named 'kfpx'", name="kfpx")) is None


#: every optional package at once: what `pip install shardwise` leaves out
_OPTIONAL = ("kfp", "mlflow", "boto3", "botocore", "matplotlib", "torchrec", "fbgemm_gpu")
REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"


def test_plan_with_a_model_directory_needs_no_extra(fitted_cost_model, tmp_path, monkeypatch, capsys):
    """`pip install shardwise` then `shardwise plan --model DIR`: nothing optional is imported."""
    monkeypatch.chdir(tmp_path)
    model = fitted_cost_model[0].save(tmp_path / "model")
    save_task(random_task(0, 8, 4), "task.json")
    _uninstalled(monkeypatch, *_OPTIONAL)
    assert main(["plan", "--task", "task.json", "--model", str(model), "--out", "plan.json"]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "plan.json").exists()


def test_profile_without_fbgemm_names_the_build_of_this_torch(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["workload", "synth", "--num-tables", "6", "--row-scale", "0.001", "--batch-size", "64",
                 "--no-index-data", "--out", "w"]) == 0
    capsys.readouterr()
    _uninstalled(monkeypatch, "fbgemm_gpu")
    assert main(["profile", "--tables", "w/tables.json", "--num-shards", "1", "--device", "cpu", "--out", "p"]) == 2
    cuda = torch.version.cuda is not None
    assert _one_line(capsys) == f"shardwise profile: error: {missing_fbgemm(torch.__version__, cuda)}"
    assert not (tmp_path / "p").exists()


def test_fbgemms_build_is_the_cuda_or_the_cpu_package_at_the_release_of_this_torch():
    assert str(missing_fbgemm("2.13.0+cpu", cuda=False)) == (
        "needs fbgemm_gpu for fbgemm's embedding kernels, which is not installed: pip install fbgemm-gpu-cpu==1.8.0 "
        "(fbgemm's CPU build, for this CPU torch 2.13.0+cpu)")
    assert fbgemm_requirement("2.13.0", cuda=True) == "fbgemm-gpu==1.8.0"
    assert fbgemm_requirement("2.13.1+cu128", cuda=True) == "fbgemm-gpu==1.8.0"
    assert fbgemm_requirement("2.99.0", cuda=False) == "fbgemm-gpu-cpu (the release built for torch 2.99)"
    # a missing fbgemm_gpu anywhere (torchrec's imports, the DLRM trainer) is the same line
    missing = missing_extra(ModuleNotFoundError("No module named 'fbgemm_gpu'", name="fbgemm_gpu.sparse_ops"))
    assert missing is not None and missing.package == "fbgemm_gpu" and missing.extra is None


def _pins(name: str) -> dict[str, str]:
    lines = (REQUIREMENTS / name).read_text().splitlines()
    return dict(m.groups() for line in lines if (m := re.fullmatch(r"([\w.-]+)==([\w.+-]+)", line.strip())))


def test_the_releases_named_are_the_ones_the_requirements_pin():
    cpu, cuda, torchrec = _pins("cpu.txt"), _pins("cuda.txt"), _pins("torchrec.txt")
    minor = ".".join(cpu["torch"].split(".")[:2])
    assert FBGEMM_FOR_TORCH[minor] == cpu["fbgemm-gpu-cpu"] == cuda["fbgemm-gpu"]
    assert TORCHREC_FOR_FBGEMM[cpu["fbgemm-gpu-cpu"]] == torchrec["torchrec"]
    pinned = dict(d.split("==") for d in TORCHREC_DEPENDENCIES if "==" in d)
    assert pinned == {name: cpu[name] for name in pinned}


def test_torchrec_beside_a_cpu_torch_is_installed_without_its_cuda_fbgemm(tmp_path, monkeypatch, capsys):
    assert torchrec_install("2.13.0", cuda=True) == 'pip install "shardwise[torchrec]"'
    cpu = torchrec_install("2.13.0+cpu", cuda=False)
    assert cpu.startswith("pip install fbgemm-gpu-cpu==1.8.0 tensordict==0.15.3 ")
    assert "then pip install --no-deps torchrec==1.8.0" in cpu
    monkeypatch.chdir(tmp_path)
    save_task(random_task(0, 8, 4), "task.json")
    _uninstalled(monkeypatch, "torchrec")
    assert main(["plan", "--task", "task.json", "--method", "torchrec", "--out", "plan.json"]) == 2
    line = _one_line(capsys)
    assert line.startswith("shardwise plan: error: needs torchrec for TorchRec's planner and sharded models, "
                           "which is not installed: pip install ")
    assert line.endswith(torchrec_install(torch.__version__, torch.version.cuda is not None))
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("verb", ["validate", "evaluate"])
def test_measuring_without_fbgemm_says_so_before_any_process_starts(verb, tmp_path, monkeypatch, capsys):
    """validate trains in one process per device: fbgemm's absence is one line from the parent, not each rank's
    traceback; evaluate says it before it measures."""
    monkeypatch.chdir(tmp_path)
    task = random_task(0, 8, 2)
    save_task(task, "task.json")
    assert main(["plan", "--task", "task.json", "--method", "size_greedy", "--out", "plan.json"]) == 0
    capsys.readouterr()
    _uninstalled(monkeypatch, "fbgemm_gpu")
    assert main([verb, "--task", "task.json", "--plan", "plan.json", "--out", "out"]) == 2
    cuda = torch.version.cuda is not None
    assert _one_line(capsys) == f"shardwise {verb}: error: {missing_fbgemm(torch.__version__, cuda)}"
    assert not (tmp_path / "out").exists()
