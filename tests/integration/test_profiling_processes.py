"""shardwise's worker processes do not re-run the user's script: a script without a `__main__` guard measures once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from shardwise.profiling.processes import main_module_hidden

pytestmark = pytest.mark.integration

#: a user's script as people write them: no `if __name__ == "__main__":` guard around the work
UNGUARDED_SCRIPT = textwrap.dedent("""
    from shardwise.profiling.comm import AllToAllSession

    with AllToAllSession(2, backend="gloo") as session:
        timings = session.measure([[8, 16]], 4, warmup_iters=1, iters=2)
    print("measured devices:", len(timings[0]))
""")


def test_a_script_without_a_main_guard_opens_a_session_and_runs_once(tmp_path) -> None:
    script = tmp_path / "plan_unguarded.py"
    script.write_text(UNGUARDED_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    # a child that re-ran the script would start its own ranks and die in multiprocessing's bootstrapping check
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines().count("measured devices: 2") == 1, done.stdout


def test_the_main_module_gets_its_name_and_path_back_even_when_starting_fails() -> None:
    main = sys.modules["__main__"]
    spec, path = main.__spec__, vars(main).get("__file__")
    with pytest.raises(OSError, match="start failed"), main_module_hidden():
        assert main.__spec__ is None and "__file__" not in vars(main)
        raise OSError("start failed")
    assert main.__spec__ is spec and vars(main).get("__file__") == path
