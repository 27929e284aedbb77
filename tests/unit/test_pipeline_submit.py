"""`shardwise pipeline submit|schedule` against a local fake of the Kubeflow Pipelines API (v2beta1).

No real KFP API server can run here; the fake answers the few endpoints kfp.Client calls and records
every request, so the tests check what a cluster would receive.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from short_stack import in_thread

from shardwise.cli import build_parser, main
from shardwise.cli.pipeline import _params
from shardwise.errors import ShardwiseError
from shardwise.pipelines import run as kubeflow
from shardwise.pipelines.params import DEFAULTS, PipelineParams, pipeline_params


class FakeKubeflow(BaseHTTPRequestHandler):
    """Records requests; answers like the KFP v2beta1 REST API would."""

    requests: list[dict] = []
    #: what GET /runs/<id> answers: how a waited-for run ends
    run_state = "SUCCEEDED"
    #: pipelines uploaded so far, by display name (GET /pipelines filters on it)
    pipelines: dict[str, str] = {}

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _answer(self, body: dict, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlparse(self.path)
        entry = {"method": self.command, "path": url.path, "query": parse_qs(url.query),
                 "authorization": self.headers.get("Authorization")}
        try:
            entry["body"] = json.loads(raw) if raw else None
        except ValueError:
            entry["body"] = raw.decode(errors="replace")
        self.requests.append(entry)
        return entry

    def do_GET(self) -> None:
        entry = self._record()
        if entry["path"].endswith("/healthz"):
            self._answer({"multi_user": False})
        elif entry["path"] == "/apis/v2beta1/experiments":
            self._answer({"experiments": [], "total_size": 0})  # none yet: the client creates it
        elif entry["path"] == "/apis/v2beta1/runs/run-1":
            self._answer({"run_id": "run-1", "state": self.run_state, "finished_at": "2026-11-24T00:00:00Z"})
        elif entry["path"] == "/apis/v2beta1/pipelines":
            wanted = json.loads(entry["query"]["filter"][0])["predicates"][0]["stringValue"]
            found = [{"pipeline_id": i, "display_name": n} for n, i in self.pipelines.items() if n == wanted]
            self._answer({"pipelines": found, "total_size": len(found)} if found else {})
        else:
            self._answer({})

    def do_POST(self) -> None:
        entry = self._record()
        if entry["path"] == "/apis/v2beta1/experiments":
            self._answer({"experiment_id": "exp-1", "display_name": entry["body"]["display_name"]})
        elif entry["path"] == "/apis/v2beta1/runs":
            self._answer({"run_id": "run-1", "display_name": entry["body"]["display_name"]})
        elif entry["path"] == "/apis/v2beta1/pipelines/upload":
            name = entry["query"]["name"][0]
            self.pipelines[name] = f"pipeline-{len(self.pipelines) + 1}"
            self._answer({"pipeline_id": self.pipelines[name], "display_name": name})
        elif entry["path"] == "/apis/v2beta1/pipelines/upload_version":
            self._answer({"pipeline_id": entry["query"]["pipelineid"][0],
                          "pipeline_version_id": f"version-{len(self.requests)}",
                          "display_name": entry["query"]["name"][0]})
        elif entry["path"] == "/apis/v2beta1/recurringruns":
            self._answer({"recurring_run_id": "rr-1", "display_name": entry["body"]["display_name"]})
        else:
            self._answer({"error": f"unexpected POST {entry['path']}"}, status=404)


@pytest.fixture
def kfp_api():
    FakeKubeflow.requests = []
    FakeKubeflow.pipelines = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeKubeflow)
    # polled for shutdown every 50 ms, not the default 0.5 s that each test waited for at its end
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", FakeKubeflow.requests
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def _default_package(tmp_path_factory) -> dict[str, Path]:
    """Where the module's one compile of the default pipeline went, once a test has asked for it."""
    return {"folder": tmp_path_factory.mktemp("package")}


@pytest.fixture(autouse=True)
def _default_compiled_once(monkeypatch, _default_package):
    """A submit or schedule of the default pipeline (no GPU product, the project's image) uploads the module's one
    compile of it (the package is the same every time, and test_pipeline_compile holds it to the golden file); other
    arguments are compiled for real. Each compile runs on a stack of its own (short_stack: kfp's compiler inspects
    the call stack for every step, seconds a compile late in the suite)."""
    real = kubeflow.compile_pipeline

    def compile_pipeline(out: str | Path, *, gpu_product: str | None = None, image: str | None = None) -> Path:
        if gpu_product is not None or image is not None:
            return in_thread(real, out, gpu_product=gpu_product, image=image)
        if "yaml" not in _default_package:
            _default_package["yaml"] = in_thread(real, _default_package["folder"] / "shardwise_pipeline.yaml")
        shutil.copyfile(_default_package["yaml"], out)
        return Path(out)

    monkeypatch.setattr(kubeflow, "compile_pipeline", compile_pipeline)


def _posts(requests: list[dict], path: str) -> list[dict]:
    return [r for r in requests if r["method"] == "POST" and r["path"] == path]


def test_submit_creates_experiment_and_one_run(kfp_api, capsys):
    host, requests = kfp_api
    status = main(["pipeline", "submit", "--host", host, "--num-devices", "8", "--search-method", "neuroshard",
                   "--model-alias", "challenger", "--gpu-product", "NVIDIA-H100-80GB-HBM3", "--name", "nightly"])
    assert status == 0
    assert "run run-1 in experiment exp-1" in capsys.readouterr().out

    (exp,) = _posts(requests, "/apis/v2beta1/experiments")
    assert exp["body"]["display_name"] == "shardwise"
    (run,) = _posts(requests, "/apis/v2beta1/runs")
    body = run["body"]
    assert body["display_name"] == "nightly"
    assert body["experiment_id"] == "exp-1"
    params = body["runtime_config"]["parameters"]
    assert params["num_devices"] == 8
    assert params["search_method"] == "neuroshard"
    assert params["model_alias"] == "challenger"
    # the compiled pipeline travels inline, with the Kubernetes platform settings
    spec = body["pipeline_spec"]
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "shardwise"
    executors = spec["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-profile-costs"]["nodeSelector"]["labels"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }
    assert not _posts(requests, "/apis/v2beta1/recurringruns")


def test_submit_with_the_commits_image_runs_every_step_in_it(kfp_api, capsys):
    """CI passes the image it built from the commit: every executor runs it, so a run uses the committed code and
    KFP's cache (keyed on the image among the rest) does not reuse steps of older code."""
    host, requests = kfp_api
    image = "ghcr.io/team/shardwise:0123abcd"
    assert main(["pipeline", "submit", "--host", host, "--image", image]) == 0
    (run,) = _posts(requests, "/apis/v2beta1/runs")
    executors = run["body"]["pipeline_spec"]["pipeline_spec"]["deploymentSpec"]["executors"]
    assert len(executors) >= 11 and {e["container"]["image"] for e in executors.values()} == {image}
    from shardwise.pipelines.components import IMAGE, STEPS, profile_costs

    assert profile_costs.component_spec.implementation.container.image == IMAGE  # put back afterwards
    assert len(STEPS) == 11


def test_each_commit_is_a_new_version_of_one_pipeline_and_the_run_is_made_from_it(kfp_api, capsys):
    """CI uploads the compiled pipeline as a version named after the commit: the pipeline is created once, each
    later commit adds a version, and each run references the version it ran (the UI shows what was run)."""
    host, requests = kfp_api
    for commit in ("0123abcd", "4567ef01"):
        assert main(["pipeline", "submit", "--host", host, "--image", f"ghcr.io/team/shardwise:{commit}",
                     "--pipeline", "shardwise-retrain", "--pipeline-version", commit, "--name", f"retrain-{commit}"]) == 0
    out = capsys.readouterr().out
    assert len(_posts(requests, "/apis/v2beta1/pipelines/upload")) == 1  # created on first use only
    uploads = _posts(requests, "/apis/v2beta1/pipelines/upload_version")
    assert [u["query"]["name"][0] for u in uploads] == ["0123abcd", "4567ef01"]
    assert {u["query"]["pipelineid"][0] for u in uploads} == {"pipeline-1"}
    assert "ghcr.io/team/shardwise:4567ef01" in uploads[1]["body"]  # the package of that commit
    runs = _posts(requests, "/apis/v2beta1/runs")
    references = [r["body"]["pipeline_version_reference"] for r in runs]
    assert [r["pipeline_id"] for r in references] == ["pipeline-1", "pipeline-1"]
    assert references[0]["pipeline_version_id"] != references[1]["pipeline_version_id"]
    assert all("pipeline_spec" not in r["body"] for r in runs)  # made from the version, not an inline package
    assert out.count("from pipeline version version-") == 2 and "Pipeline details" not in out


def test_the_runs_page_is_printed_without_the_credentials_of_the_host(kfp_api, capsys):
    """kfp prints a run's link with the host as given; a host carrying user:password@ must not reach the terminal:
    the summary gives the page redacted, and a version without a pipeline is refused before any request."""
    host, requests = kfp_api
    with_password = host.replace("http://", "http://ci:hunter2@")
    assert main(["pipeline", "submit", "--host", with_password, "--pipeline", "p", "--pipeline-version", "v1"]) == 0
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err
    assert f"{host.replace('http://', 'http://***@')}/#/runs/details/run-1" in out
    before = len(requests)
    assert main(["pipeline", "submit", "--host", host, "--pipeline-version", "v1"]) == 2
    assert "--pipeline NAME" in capsys.readouterr().err and len(requests) == before


def test_schedule_creates_recurring_run_with_cron(kfp_api, capsys):
    host, requests = kfp_api
    status = main(["pipeline", "schedule", "--host", host, "--cron", "0 3 * * 1", "--name", "weekly-retrain",
                   "--profile-num-shards", "2000"])
    assert status == 0
    assert "recurring run rr-1" in capsys.readouterr().out
    (job,) = _posts(requests, "/apis/v2beta1/recurringruns")
    body = job["body"]
    assert body["display_name"] == "weekly-retrain"
    assert body["experiment_id"] == "exp-1"
    # standard 5-field cron gains KFP's leading seconds field
    assert body["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * 1"
    assert body["max_concurrency"] == "1" or body["max_concurrency"] == 1
    assert body["no_catchup"] is True
    assert body["runtime_config"]["parameters"]["profile_num_shards"] == 2000
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "shardwise"
    assert not _posts(requests, "/apis/v2beta1/runs")


def _exit_code(argv: list[str]) -> int | str | None:
    """main's exit code, argparse's usage errors (which exit from inside parse_args) included."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def test_unknown_mistyped_or_out_of_range_parameters_are_refused_before_any_request(kfp_api, capsys):
    host, requests = kfp_api
    assert _exit_code(["pipeline", "submit", "--host", host, "--num-tabels", "10"]) == 2
    assert "unrecognized arguments: --num-tabels 10" in capsys.readouterr().err
    assert _exit_code(["pipeline", "submit", "--host", host, "--num-devices", "four"]) == 2
    assert "argument --num-devices: invalid int value: 'four'" in capsys.readouterr().err
    assert _exit_code(["pipeline", "submit", "--host", host, "--num-devices", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'num_devices': Input should be greater than or equal to 2" in err
    assert requests == []


VERBS = (["run", "--local"], ["submit", "--host", "http://127.0.0.1:9"],
         ["schedule", "--host", "http://127.0.0.1:9", "--cron", "0 3 * * *"])


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_each_verb_takes_the_preset_then_one_flag_per_parameter_and_no_other_way(verb, tmp_path):
    """`run --local`, `submit` and `schedule` set a parameter the same two ways: the preset, then its flag; no
    `--arg NAME=VALUE`, no config file."""
    parser = build_parser("pipeline")
    args = parser.parse_args(["pipeline", *verb, "--preset", "smoke", "--num-devices", "8",
                              "--production-tasks", "ranking.task.json"])
    params = _params(args)
    smoke = pipeline_params(preset_name="smoke")
    assert params.num_devices == 8 and params.production_tasks == str(Path("ranking.task.json").resolve())
    assert params.model_dump(exclude={"num_devices", "production_tasks"}) == \
        smoke.model_dump(exclude={"num_devices", "production_tasks"})
    for other_way in (["--arg", "num_devices=8"], ["--config", str(tmp_path / "c.yaml")]):
        with pytest.raises(SystemExit):
            parser.parse_args(["pipeline", *verb, *other_way])


def test_the_parameters_help_is_one_group_with_the_presets_values(capsys):
    with pytest.raises(SystemExit):
        main(["pipeline", "submit", "--help"])
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    assert "--num-devices" not in usage and usage.rstrip().endswith("[--PARAMETER VALUE ...]")
    group = rest.split("pipeline parameters (override the preset):\n", 1)[1]
    for name in PipelineParams.model_fields:
        assert "--" + name.replace("_", "-") in group
    assert f"devices of the evaluation task (preset cluster: {DEFAULTS.num_devices})" in " ".join(group.split())


def test_bad_cron_is_refused():
    with pytest.raises(ShardwiseError, match="expected 5 or 6 fields"):
        kubeflow.schedule("http://127.0.0.1:9", "daily", DEFAULTS)



def test_run_needs_local_and_refuses_unknown_arguments_before_running(tmp_path, capsys):
    assert main(["pipeline", "run", "--workdir", str(tmp_path)]) == 2
    assert "only --local runs here" in capsys.readouterr().err
    assert _exit_code(["pipeline", "run", "--local", "--workdir", str(tmp_path), "--gpus", "2"]) == 2
    assert "unrecognized arguments: --gpus 2" in capsys.readouterr().err
    assert not (tmp_path / "pipeline_root").exists()


class Garbage(BaseHTTPRequestHandler):
    """Something that is not the KFP API: 200 and an HTML page to every request."""

    def _garbage(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>not kubeflow</html>")

    do_GET = do_POST = _garbage

    def log_message(self, *args) -> None:
        pass


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("verb", [["submit"], ["schedule", "--cron", "0 3 * * *"]])
def test_an_unreachable_or_wrong_host_is_one_line_with_credentials_redacted(verb, capsys):
    host = f"http://ci:hunter2@127.0.0.1:{_closed_port()}"
    assert main(["pipeline", *verb, "--host", host, "--preset", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "127.0.0.1" in err and "hunter2" not in err

    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        assert main(["pipeline", *verb, "--host", f"http://127.0.0.1:{server.server_address[1]}",
                     "--preset", "smoke"]) == 2
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a Kubeflow Pipelines API" in err


@pytest.mark.parametrize("state, code", [("SUCCEEDED", 0), ("FAILED", 2)])
def test_submit_waits_for_the_run_and_fails_unless_it_succeeded(kfp_api, capsys, monkeypatch, state, code):
    """CI retraining goes red when its run fails; the token travels from $KFP_TOKEN as a bearer header."""
    host, requests = kfp_api
    monkeypatch.setattr(FakeKubeflow, "run_state", state)
    monkeypatch.setenv("KFP_TOKEN", "t0ken")
    assert main(["pipeline", "submit", "--host", host, "--preset", "smoke", "--wait", "60"]) == code
    out, err = capsys.readouterr()
    if code == 0:
        assert "run run-1 in experiment exp-1: SUCCEEDED" in out
    else:
        assert err.count("\n") == 1 and "run run-1 ended FAILED" in err
    assert any(r["path"] == "/apis/v2beta1/runs/run-1" for r in requests)
    assert {r["authorization"] for r in requests if r["path"].startswith("/apis/v2beta1/")} == {"Bearer t0ken"}
