"""The command line: options generated from the jobs' settings (no drift), config files, errors, fast help."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from shardwise.cli import VERBS, build_parser, main
from shardwise.cli.options import flag
from shardwise.jobs import (
    benchmark,
    evaluate,
    plan,
    pretrain,
    profile,
    publish,
    task,
    train_policy,
    validate,
    workload,
)
from shardwise.profiling import MeasurementSettings

#: (argv prefix, settings the verb builds, fields the verb fills in itself)
SETTINGS = [
    (["task", "check"], task.CheckSettings, set()),
    (["workload", "synth"], workload.SynthSettings, set()),
    (["workload", "from"], workload.GivenSettings, set()),
    (["workload", "split"], workload.SplitSettings, set()),
    (["workload", "task"], workload.TaskSettings, set()),
    (["augment"], workload.AugmentSettings, set()),
    (["profile"], profile.ProfileJobSettings, set()),
    (["pretrain"], pretrain.PretrainSettings, set()),
    (["train-policy"], train_policy.TrainPolicySettings, set()),
    (["plan"], plan.PlanSettings, {"options"}),
    (["evaluate"], evaluate.EvaluateSettings, set()),
    (["validate"], validate.ValidateSettings, set()),
    (["benchmark"], benchmark.BenchmarkSettings, set()),
    (["publish"], publish.PublishSettings, set()),
]


def _parser_for(argv: list[str]) -> argparse.ArgumentParser:
    parser = build_parser(argv[0])
    for word in argv:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[word]
    return parser


def _dests(parser: argparse.ArgumentParser) -> set[str]:
    """The options' destinations (a verb's actions, such as `plan show`, are not options)."""
    return {a.dest for a in parser._actions if not isinstance(a, argparse._SubParsersAction)} - {
        "help", "config", "debug"}


@pytest.mark.parametrize(("argv", "settings_type", "own"), SETTINGS, ids=[" ".join(s[0]) for s in SETTINGS])
def test_every_settings_field_is_an_option_and_every_option_a_field(argv, settings_type, own):
    dests = {d for d in _dests(_parser_for(argv)) if not d.startswith("option:")}
    expected = set()
    for name, field in settings_type.model_fields.items():
        if name in own:
            continue
        if field.annotation is MeasurementSettings:
            expected |= {f"{name}.{sub}" for sub in MeasurementSettings.model_fields}
        else:
            expected.add(name)
    assert dests == expected


def test_help_shows_the_settings_default_so_the_settings_stay_the_only_home_of_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    out = capsys.readouterr().out
    assert f"(default: {MeasurementSettings().timing_rounds})" in out and "--timing-rounds" in out


def test_a_setting_on_by_default_can_be_turned_off():
    parser = _parser_for(["evaluate"])
    assert not hasattr(parser.parse_args([]), "refine_from_greedy")  # the settings' default (True) stands
    assert parser.parse_args(["--no-refine-from-greedy"]).refine_from_greedy is False
    assert parser.parse_args(["--refine-from-greedy"]).refine_from_greedy is True


def test_every_verb_has_a_parser_and_help(capsys):
    for verb in VERBS:
        with pytest.raises(SystemExit) as stop:
            main([verb, "--help"])
        assert stop.value.code == 0
        assert "usage: shardwise" in capsys.readouterr().out


def test_config_file_values_are_overridden_by_flags(tmp_path, capsys):
    (tmp_path / "w").mkdir()
    config = tmp_path / "synth.yaml"
    config.write_text("num-tables: 12\nrow_scale: 0.001\nbatch_size: 256\nno_index_data: true\n")
    assert main(["workload", "synth", "--config", str(config), "--num-tables", "7", "--out", str(tmp_path / "w")]) == 0
    assert "7 tables, batch 256" in capsys.readouterr().out
    config.write_text("num_tabels: 3\n")
    assert main(["workload", "synth", "--config", str(config), "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err  # a typo in a config file is an error naming the file, not a no-op
    assert "synth.yaml: 'num_tabels' not a setting here" in err and "num_tables" in err


def test_a_missing_required_flag_is_named(capsys):
    assert main(["workload", "task", "--num-tables", "3"]) == 2
    err = capsys.readouterr().err
    assert "--tables, --num-devices, --out are required" in err and "Traceback" not in err


def test_debug_shows_the_traceback_of_a_failure(tmp_path, capsys):
    assert main(["task", "check", str(tmp_path / "absent.json")]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["task", "check", str(tmp_path / "absent.json"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "no such task file" in err


def test_option_of_another_method_is_refused(tmp_path, capsys):
    assert main(["plan", "--task", "t.json", "--out", "p.json", "--method", "size_greedy", "--beam-width", "3"]) == 2
    assert "--beam-width does not apply to --method size_greedy" in capsys.readouterr().err


def _command_lines() -> list[tuple[str, ...]]:
    """Every verb the CLI lists, and each verb's own verbs (`workload synth`, `pipeline compile`, `plan show`)."""
    lines = []
    for verb in VERBS:
        lines.append((verb,))
        subs = [a for a in _parser_for([verb])._actions if isinstance(a, argparse._SubParsersAction)]
        lines += [(verb, sub) for action in subs for sub in action.choices]
    return lines


#: command lines that answer without torch, MLflow or kfp: every verb's help, a task's check, and usage mistakes of
#: several verbs (their options come from the jobs' settings, which load the kernels, the models, the registry's
#: client and the policy networks only when a job runs)
FAST = {
    "help": (["--help"], "usage: shardwise"),
    **{f"{' '.join(line)} help": ([*line, "--help"], f"usage: shardwise {' '.join(line)} ") for line in _command_lines()},
    "task check": (["task", "check", "TASK"], "4 tables"),
    "plan unknown flag": (["plan", "--task", "TASK", "--out", "p.json", "--bogus"], "unrecognized arguments: --bogus"),
    "plan unknown method": (["plan", "--task", "TASK", "--out", "p.json", "--method", "nope"], "invalid choice: 'nope'"),
    "plan missing flag": (["plan", "--task", "TASK"], "--out is required"),
    "plan option of another method": (["plan", "--task", "TASK", "--out", "p.json", "--method", "size_greedy",
                                       "--beam-width", "3"], "--beam-width does not apply"),
    "evaluate missing flag": (["evaluate", "--task", "TASK"], "--plan is required"),
    "validate unknown flag": (["validate", "--task", "TASK", "--plan", "p.json", "--bogus"],
                              "unrecognized arguments: --bogus"),
    "benchmark unknown method": (["benchmark", "--tables", "t.json", "--methods", "nope"],
                                 "search method 'nope' is not registered"),
    "profile caching on a cpu": (["profile", "--tables", "t.json", "--out", "costs", "--caching-shards", "1",
                                  "--device", "cpu"], "fused_uvm_caching needs a CUDA device"),
    "pretrain out of range": (["pretrain", "--data", "costs", "--out", "m", "--epochs", "0"],
                              "--epochs 0: Input should be greater than or equal to 1"),
    "train-policy unknown method": (["train-policy", "--method", "nope"], "invalid choice: 'nope'"),
    "publish out of range": (["publish", "--task", "TASK", "--refine-s", "-1"], "--refine-s -1.0: Input should be"),
}


#: a fresh interpreter that runs one `plan --help` (what every verb's options load: pydantic and the jobs'
#: settings), says whether that imported torch, MLflow or kfp, then runs each command line it is sent in a fork of
#: itself (cwd, stdout and stderr files, argv: one JSON line each; "done" when the fork has exited): a command line
#: costs its own imports only, not the interpreter's start and the settings' (0.3 s a line on 2 cores)
_FORKING_CLI = """
import contextlib, io, json, os, signal, sys
from shardwise.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["plan", "--help"])
    except SystemExit:
        pass
print('torch' in sys.modules, 'mlflow' in sys.modules, 'kfp' in sys.modules, flush=True)
for line in sys.stdin:
    cwd, out, err, argv = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.alarm(120)  # a command line that hangs ends its fork, not the test run
        os.chdir(cwd)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = ["-c", *argv]
        try:
            main(argv)
        except SystemExit:
            pass
        print('torch' in sys.modules, 'mlflow' in sys.modules, 'kfp' in sys.modules, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    print("done", flush=True)
"""


@pytest.fixture(scope="module")
def forking_cli():
    """The _FORKING_CLI interpreter, once it has said that its own start imported none of torch, MLflow, kfp."""
    proc = subprocess.Popen([sys.executable, "-c", _FORKING_CLI], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "False False False"
    yield proc
    proc.stdin.close()
    proc.wait(30)


@pytest.mark.parametrize(("argv", "says"), FAST.values(), ids=FAST)
def test_help_task_check_and_usage_mistakes_do_not_import_torch(argv, says, tmp_path, forking_cli):
    from search_doubles import random_task

    from shardwise.workload import save_task

    path = save_task(random_task(0, 4, 2), tmp_path / "task.json")
    argv = [str(path) if a == "TASK" else a for a in argv]
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    forking_cli.stdin.write(json.dumps([str(tmp_path), str(out), str(err), argv]) + "\n")
    forking_cli.stdin.flush()
    assert forking_cli.stdout.readline().strip() == "done"
    stdout, stderr = out.read_text(), err.read_text()
    assert says in stdout + stderr  # it answered what was asked, not something else without torch
    assert stderr.strip().splitlines()[-1] == "False False False", stderr


def test_a_policy_method_loads_its_networks_only_when_its_policy_is_used(tmp_path):
    """DreamShard's entry is in the registry without its module (torch); loading a policy through it imports it."""
    code = (
        "import sys\n"
        "from shardwise.search import get_method\n"
        "spec = get_method('dreamshard')\n"
        "print('shardwise.search.dreamshard' in sys.modules)\n"
        "try:\n    spec.policy.load(sys.argv[1], 'cpu')\nexcept Exception as err:\n    print(type(err).__name__)\n"
        "print('shardwise.search.dreamshard' in sys.modules, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "PolicyError", "True", "True"], done.stderr


def test_flags_follow_field_names():
    assert flag("num_devices") == "--num-devices"


def test_credentials_in_a_tracking_uri_never_reach_the_terminal(tmp_path, monkeypatch, capsys):
    from search_doubles import random_task

    from shardwise.workload import save_task

    monkeypatch.chdir(tmp_path)
    save_task(random_task(0, 6, 2), "task.json")
    uri = "sqlite:///nowhere/s3cret.db"  # a store that does not exist: the message names it
    assert main(["plan", "--task", "task.json", "--tracking-uri", uri, "--out", "p.json"]) == 2
    assert "nowhere/s3cret.db" in capsys.readouterr().err
    from shardwise.integrations.mlflow import MlflowService, redacted

    assert redacted("https://user:hunter2@mlflow.example/") == "https://***@mlflow.example/"
    assert "hunter2" not in repr(MlflowService("https://user:hunter2@mlflow.example/"))
