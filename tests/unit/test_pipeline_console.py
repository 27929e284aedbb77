"""The local run's console: the whole log keeps every run, a step's log holds its latest run."""

import io
import os

from shardwise.pipelines.console import StepConsole


def _run(console: StepConsole, steps: list[str], said: str) -> None:
    for step in steps:
        console.line(f"Executing task '{step}'")
        console.line(f"{step} {said}")
        console.line(f"Task '{step}' finished with status SUCCESS")


def test_a_steps_log_holds_its_latest_run_and_a_loops_iterations_together(tmp_path):
    log_path = tmp_path / "pipeline.log"
    _run(StepConsole(log_path, io.StringIO()), ["profile-costs", "profile-costs", "pretrain"], "first run")
    _run(StepConsole(log_path, io.StringIO()), ["profile-costs", "profile-costs"], "second run")

    profile = (tmp_path / "logs/profile-costs.log").read_text()
    assert "first run" not in profile and profile.count("profile-costs second run") == 2  # both loop iterations
    assert profile.startswith("Executing task 'profile-costs'")
    assert "pretrain first run" in (tmp_path / "logs/pretrain.log").read_text()  # a step not run again is kept


def test_the_whole_log_keeps_each_run_after_its_start_line(tmp_path):
    log_path = tmp_path / "pipeline.log"
    for said in ("first run", "second run"):
        read_fd, write_fd = os.pipe()
        os.write(write_fd, f"Executing task 'pretrain'\npretrain {said}\n".encode())
        os.close(write_fd)
        StepConsole(log_path, io.StringIO()).pump(read_fd)
    text = log_path.read_text()
    assert text.count("=== pipeline run started") == 2
    assert text.index("first run") < text.rindex("=== pipeline run started") < text.index("second run")
