"""The compiled pipeline: identical to the committed golden YAML, and the cluster settings are in it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from short_stack import in_thread

from shardwise.cli import main
from shardwise.pipelines.components import STEPS
from shardwise.pipelines.params import DEFAULTS, PipelineArgumentError, pipeline_params, preset, preset_names
from shardwise.pipelines.pipeline import (
    CONFIG_MAP_KEYS,
    CONFIG_MAP_NAME,
    GPU_RESOURCE,
    IMAGE,
    SECRET_KEYS,
    SECRET_NAME,
)
from shardwise.pipelines.run import compile_components

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "pipelines" / "shardwise_pipeline.yaml"
REGENERATE = "regenerate with `.venv/bin/python pipelines/compile.py` and review the diff"
#: libyaml's safe loader where PyYAML has it (a tenth of the pure-Python loader's time on the 80 kB pipeline)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
GPU_EXECUTORS = ("exec-profile-costs", "exec-profile-all-to-alls", "exec-evaluate-plans", "exec-publish-plans")


def _tasks(spec: dict) -> dict:
    """Every task of the pipeline by name, those inside loops (the profiling fan-out) included."""
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks |= component.get("dag", {}).get("tasks", {})
    return tasks


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Callable[..., str]:
    """compiled(*flags): the YAML `shardwise pipeline compile` writes with these flags, compiled once per module
    for the tests that only read it, on a stack of its own (short_stack: kfp's compiler inspects the call stack
    for every step, seconds a compile in a process that has imported the whole test suite's modules)."""
    texts: dict[tuple[str, ...], str] = {}

    def text(*extra: str) -> str:
        if extra not in texts:
            out = tmp_path_factory.mktemp("compiled") / "pipeline.yaml"
            assert in_thread(main, ["pipeline", "compile", "--out", str(out), *extra]) == 0
            texts[extra] = out.read_text()
        return texts[extra]

    return text


@pytest.fixture
def compile_specs(compiled) -> Callable[..., tuple[dict, dict]]:
    """compile_specs(*flags): (pipeline spec, platform spec) of that YAML, parsed afresh for each test."""

    def specs(*extra: str) -> tuple[dict, dict]:
        pipeline_spec, platform_spec = yaml.load_all(compiled(*extra), Loader=SAFE_LOADER)
        return pipeline_spec, platform_spec

    return specs


@pytest.fixture(scope="module")
def components_dir(tmp_path_factory) -> Path:
    """Every step's component compiled once for the module."""
    out = tmp_path_factory.mktemp("components")
    assert sorted(p.stem for p in in_thread(compile_components, out)) == sorted(STEPS)
    return out


def test_compiled_pipeline_matches_golden_file(compiled):
    assert compiled() == GOLDEN.read_text(), f"{GOLDEN} is stale: {REGENERATE}"


@pytest.mark.parametrize("step", STEPS)
def test_compiled_components_match_golden_files(components_dir, step):
    golden = ROOT / "components" / f"{step}.yaml"
    assert (components_dir / f"{step}.yaml").read_text() == golden.read_text(), f"{golden} is stale: {REGENERATE}"


def test_every_step_runs_the_project_image_without_installing_kfp(compile_specs):
    spec, _ = compile_specs()
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) == len(STEPS) + 1  # search_plan runs twice: the method and TorchRec
    for name, executor in executors.items():
        container = executor["container"]
        assert container["image"] == IMAGE, name
        # the image has shardwise (and kfp) installed: no pip install at step start
        assert "pip install" not in " ".join(container["command"]), name


def test_gpu_steps_ask_for_accelerators_and_tolerate_gpu_taints(compile_specs):
    spec, platform = compile_specs("--gpu-product", "NVIDIA-H100-80GB-HBM3")
    executors = spec["deploymentSpec"]["executors"]
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in GPU_EXECUTORS:
        accelerator = executors[name]["container"]["resources"]["accelerator"]
        assert accelerator["resourceType"] == GPU_RESOURCE
        assert k8s[name]["tolerations"] == [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        assert k8s[name]["nodeSelector"]["labels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        # NCCL between the GPUs of one pod needs more than the container's 64 MiB /dev/shm
        (shm,) = k8s[name]["emptyDirMounts"]
        assert shm["mountPath"] == "/dev/shm" and shm["medium"] == "Memory", name
    # what each step's command needs: evaluation runs one process per device of the task, all-to-all profiling
    # spans all the GPUs it sees (with one, profiling stops at "max_devices must be >= 2"), and each kernel
    # profiling pod of the fan-out times its slice of the shards on one GPU
    for name in ("exec-evaluate-plans", "exec-profile-all-to-alls", "exec-publish-plans"):
        count = executors[name]["container"]["resources"]["accelerator"]["resourceCount"]
        assert count == "{{$.inputs.parameters['pipelinechannel--num_devices']}}", name
    assert executors["exec-profile-costs"]["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    for name in set(executors) - set(GPU_EXECUTORS):
        assert "accelerator" not in executors[name]["container"]["resources"], name
        assert "tolerations" not in k8s[name] and "nodeSelector" not in k8s[name], name
    # every step requests CPU and memory: no best-effort pods beside measurements on GPU nodes
    for name, executor in executors.items():
        resources = executor["container"]["resources"]
        assert resources["resourceCpuRequest"] and resources["resourceMemoryRequest"], name
        assert resources["resourceMemoryLimit"], name


def test_node_selector_only_when_a_gpu_product_is_named(compile_specs):
    _, platform = compile_specs()
    for name, settings in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
        assert "nodeSelector" not in settings, name


def test_every_step_reads_s3_and_mlflow_settings_from_secret_and_config_map(compile_specs):
    spec, platform = compile_specs()
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(k8s) == set(spec["deploymentSpec"]["executors"])
    for name, settings in k8s.items():
        (secret,) = settings["secretAsEnv"]
        assert secret["secretName"] == SECRET_NAME, name
        assert {kv["secretKey"] for kv in secret["keyToEnv"]} == set(SECRET_KEYS)
        (config_map,) = settings["configMapAsEnv"]
        assert config_map["configMapName"] == CONFIG_MAP_NAME, name
        assert {kv["configMapKey"] for kv in config_map["keyToEnv"]} == set(CONFIG_MAP_KEYS)


def test_parameters_cover_size_devices_method_and_alias(compile_specs):
    spec, _ = compile_specs()
    declared = spec["root"]["inputDefinitions"]["parameters"]
    # the compiled pipeline declares every parameter, with the cluster preset's values as defaults
    assert set(declared) == set(DEFAULTS.model_fields)
    for name, value in DEFAULTS.model_dump().items():
        assert declared[name]["defaultValue"] == value, name
    assert DEFAULTS.model_alias == "champion" and DEFAULTS.device == "cuda"
    # every preset is a valid set of arguments
    local = pipeline_params(preset_name="local")
    assert local.device == "cpu" and local.num_devices == 4


def test_measurement_steps_are_never_cached(compile_specs):
    spec, _ = compile_specs()
    tasks = _tasks(spec)
    for name in ("profile-costs", "profile-all-to-alls", "evaluate-plans"):
        assert tasks[name]["cachingOptions"] == {}, name  # enableCache absent = false
    assert tasks["search-plan"]["cachingOptions"] == {"enableCache": True}


def test_baseline_plan_is_torchrec_and_uses_no_model(compile_specs):
    spec, _ = compile_specs()
    tasks = spec["root"]["dag"]["tasks"]
    baseline = tasks["search-plan-2"]["inputs"]
    assert baseline["parameters"]["method"]["runtimeValue"]["constant"] == "torchrec"
    assert "model" not in baseline.get("artifacts", {})
    assert tasks["search-plan"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]["producerTask"] == (
        "pretrain-cost-model"
    )


def test_argument_checks_name_the_parameter():
    params = pipeline_params({"num_devices": "8", "row_scale": "0.5"})
    assert (params.num_devices, params.row_scale) == (8, 0.5)
    with pytest.raises(PipelineArgumentError, match="'num_devices': Input should be a valid integer"):
        pipeline_params({"num_devices": 2.5})
    with pytest.raises(PipelineArgumentError, match="'devices' is unknown"):
        pipeline_params({"devices": 2})
    # out-of-range and unknown values are refused before anything is submitted
    for bad, field in (({"device": "tpu"}, "device"), ({"num_devices": -3}, "num_devices"),
                       ({"search_method": "bo gus"}, "search_method")):
        with pytest.raises(PipelineArgumentError, match=f"'{field}'"):
            pipeline_params(bad)


def test_held_out_tables_are_profiled_apart_and_named_to_pretrain(compile_specs):
    spec, _ = compile_specs()
    tasks = spec["root"]["dag"]["tasks"]
    holdout = {"outputArtifactKey": "holdout_tables", "producerTask": "make-workload"}
    # the tables the task is drawn from are the ones profiled apart and held out by pretrain
    for name in ("make-task", "pretrain-cost-model"):
        artifacts = tasks[name]["inputs"]["artifacts"]
        key = "tables" if name == "make-task" else "holdout_tables"
        assert artifacts[key]["taskOutputArtifact"] == holdout, name
    profile = _tasks(spec)["profile-costs"]["inputs"]  # inside the fan-out: the loop passes the tables through
    assert profile["artifacts"]["holdout_tables"] == {"componentInputArtifact": "pipelinechannel--make-workload-holdout_tables"}
    assert profile["artifacts"]["tables"] == {"componentInputArtifact": "pipelinechannel--augment-tables-augmented"}
    assert profile["parameters"]["holdout_shards"] == {
        "componentInputParameter": "pipelinechannel--profile_holdout_shards"
    }
    local = preset("local")
    assert 0 < local["profile_holdout_shards"] < local["profile_num_shards"]


def test_kernel_profiling_fans_out_over_workers_and_pretrain_collects_every_slice(compile_specs):
    spec, _ = compile_specs()
    tasks = spec["root"]["dag"]["tasks"]
    (loop,) = [name for name in tasks if name.startswith("for-loop")]
    iterator = tasks[loop]["parameterIterator"]
    assert iterator["items"] == {"inputParameter": "pipelinechannel--worker-slices-Output"}
    profile = _tasks(spec)["profile-costs"]["inputs"]["parameters"]
    assert profile["worker"] == {"componentInputParameter": iterator["itemInput"]}
    assert profile["workers"] == {"componentInputParameter": "pipelinechannel--profile_workers"}
    assert tasks["worker-slices"]["inputs"]["parameters"]["workers"] == {"componentInputParameter": "profile_workers"}
    pretrain = tasks["pretrain-cost-model"]["inputs"]
    assert pretrain["artifacts"]["costs"]["taskOutputArtifact"] == {"outputArtifactKey": "pipelinechannel--profile-costs-costs",
                                                                    "producerTask": loop}
    assert pretrain["artifacts"]["comm_costs"]["taskOutputArtifact"]["producerTask"] == "profile-all-to-alls"
    assert pretrain["parameters"]["dataset_uri"] == {"componentInputParameter": "dataset_uri"}
    with pytest.raises(PipelineArgumentError, match="dataset_uri"):
        pipeline_params({"dataset_uri": "/local/dir"})


def test_production_tasks_are_published_after_evaluate_only_when_the_run_names_some(compile_specs):
    spec, _ = compile_specs()
    declared = spec["root"]["inputDefinitions"]["parameters"]["production_tasks"]
    assert declared["parameterType"] == "STRING" and declared["defaultValue"] == ""
    assert all(preset(name).get("production_tasks", "") == "" for name in preset_names())
    tasks = spec["root"]["dag"]["tasks"]
    (group,) = [task for task in tasks.values() if task.get("triggerPolicy")]
    assert group["triggerPolicy"]["condition"] == "inputs.parameter_values['pipelinechannel--production_tasks'] != ''"
    assert {"evaluate-plans", "pretrain-cost-model"} <= set(group["dependentTasks"])  # after the model and evaluate
    publish = _tasks(spec)["publish-plans"]
    assert publish["taskInfo"]["name"] == "publish" and publish["cachingOptions"] == {}  # measures: never cached
    inputs = publish["inputs"]
    assert inputs["artifacts"]["model"] == {"componentInputArtifact": "pipelinechannel--pretrain-cost-model-model"}
    assert group["inputs"]["parameters"]["pipelinechannel--profile-all-to-alls-Output"]["taskOutputParameter"][
        "producerTask"] == "profile-all-to-alls"
    for name, parameter in (("production_tasks", "production_tasks"), ("model_alias", "model_alias"),
                            ("device", "device"), ("timing_rounds", "evaluate_timing_rounds"),
                            ("refine_s", "publish_refine_s")):
        assert inputs["parameters"][name] == {"componentInputParameter": f"pipelinechannel--{parameter}"}, name
    # the production path refines by default in every preset that can publish; the smoke run too, briefly
    declared = spec["root"]["inputDefinitions"]["parameters"]["publish_refine_s"]
    assert declared["parameterType"] == "NUMBER_DOUBLE" and declared["defaultValue"] == DEFAULTS.publish_refine_s > 0
    assert all(pipeline_params(preset_name=name).publish_refine_s > 0 for name in preset_names())
    from shardwise.jobs.publish import PublishSettings

    assert pipeline_params(preset_name="local").publish_refine_s == PublishSettings.model_fields["refine_s"].default
    # every value the step reads, its GPU count's included, is passed into the condition's group
    (component,) = [c for c in spec["components"].values() if "publish-plans" in c.get("dag", {}).get("tasks", {})]
    group_inputs = set(component["inputDefinitions"]["parameters"])
    read = {v["componentInputParameter"] for v in inputs["parameters"].values() if "componentInputParameter" in v}
    assert read <= group_inputs and "pipelinechannel--num_devices" in read
    resources = spec["deploymentSpec"]["executors"]["exec-publish-plans"]["container"]["resources"]
    assert resources["resourceCpuRequest"] == "8"
    assert resources["accelerator"]["resourceCount"] == "{{$.inputs.parameters['pipelinechannel--num_devices']}}"


def test_production_tasks_are_paths_or_objects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = pipeline_params({"production_tasks": " a.task.json, s3://bucket/tasks/b.task.json "})
    assert params.production_tasks == f"{tmp_path / 'a.task.json'},s3://bucket/tasks/b.task.json"
    assert pipeline_params({"production_tasks": ""}).production_tasks == ""
    for bad in ("a.json,,b.json", "https://host/a.json"):
        with pytest.raises(PipelineArgumentError, match="'production_tasks'"):
            pipeline_params({"production_tasks": bad})
