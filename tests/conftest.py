"""Shared test setup: test-support modules (cost-data makers, cost-model doubles) importable by name."""

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# pytest runs with --import-mode=importlib (test files in unit/ and integration/ share basenames),
# which does not put test folders on sys.path; the support modules live beside the unit tests.
sys.path.insert(0, str(Path(__file__).parent / "unit"))


import pytest  # noqa: E402 - after the path set-up above


@pytest.fixture()
def round_robin():
    """A search method registered for one test only (one registry entry, nothing else lists it)."""
    from search_doubles import RoundRobinOptions, RoundRobinSearch

    from shardwise.search import MethodSpec, register_method, unregister_method

    register_method(MethodSpec(name="round_robin", factory=RoundRobinSearch, options=RoundRobinOptions,
                               description="table i on device i + offset (a test method)"))
    yield "round_robin"
    unregister_method("round_robin")


@pytest.fixture(scope="session")
def fitted_cost_model():
    """(model, training report): a NeuralCostModel fitted for 40 epochs on synthetic measurements of 26 tables in
    two sources (one held out) and all-to-alls, once per test session: for tests that only read it (predictions,
    save and load, searches with a learned model). A test that changes an attribute puts it back."""
    import pandas as pd
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model

    frame = pd.concat(
        [cost_frame({"a": synthetic_tables("a", 20, 0), "h": synthetic_tables("h", 6, 1)}, {"a": 120, "h": 30}, 0),
         comm_rows(20, 0)],
        ignore_index=True,
    )
    return train_cost_model(frame, 0, TrainConfig(epochs=40, comm_epochs=40, progress=False))


#: makes the empty store at argv[1] as `open_client` makes one where none exists (MLflow's registry store: every
#: table, every migration run, no experiment yet)
_MAKE_EMPTY_STORE = """
import sys
from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore
SqlAlchemyStore(f"sqlite:///{sys.argv[1]}").engine.dispose()
"""

#: what the selected tests will ask for and takes seconds to make, started in processes of their own once
#: collection has chosen the tests (pytest_collection_finish), in a folder of its own ("root")
_EARLY: dict[str, Any] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start making the empty store and booting the shared mlflow server, where the selected tests use them, in the
    background: on 2 cores the other core makes them while the tests before the first user run (the first user
    waited 5-10 s for them)."""
    wanted = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    if not wanted & {"empty_store_file", "mlflow_registry"}:
        return
    root = _EARLY["root"] = Path(tempfile.mkdtemp(prefix="shardwise-tests-"))
    if "empty_store_file" in wanted:
        path = root / "empty-store" / "mlflow.db"
        path.parent.mkdir()
        _EARLY["empty_store"] = path, subprocess.Popen([sys.executable, "-c", _MAKE_EMPTY_STORE, str(path)],
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if "mlflow_registry" in wanted:
        from service_processes import MlflowProcess

        (root / "mlflow-registry").mkdir()
        server = _EARLY["mlflow_registry"] = MlflowProcess(root / "mlflow-registry")
        server.launch()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What was started early and never asked for is stopped; its folder removed."""
    if (server := _EARLY.pop("mlflow_registry", None)) is not None:
        server.kill()
    if (early := _EARLY.pop("empty_store", None)) is not None:
        early[1].kill()
        early[1].wait()
    if (root := _EARLY.pop("root", None)) is not None:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def mlflow_registry(tmp_path_factory):
    """One real `mlflow server` (service_processes.MlflowProcess: sqlite store, artifacts proxied) for the whole run,
    booted in the background once collection shows a test needs it: the modules that need a tracking server share
    it, each test registering under names of its own (its hardware kind), so none sees another's versions. Fault
    tests kill it and start it again; a test that finds it down starts it (`.proc is None`)."""
    from service_processes import MlflowProcess

    server = _EARLY.pop("mlflow_registry", None)
    if server is None:  # asked for by a test collection did not see using it
        server = MlflowProcess(tmp_path_factory.mktemp("mlflow-registry"))
        server.launch()
    server.ready()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def empty_store_file(tmp_path_factory) -> Path:
    """An empty embedded MLflow store (_MAKE_EMPTY_STORE), made once per test session, in the background from
    collection on: the migrations take 4-10 s a store on 2 busy cores."""
    early = _EARLY.pop("empty_store", None)
    path, proc = early if early is not None else (tmp_path_factory.mktemp("empty-store") / "mlflow.db", None)
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-c", _MAKE_EMPTY_STORE, str(path)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and path.is_file(), f"the empty MLflow store was not made: {err[-2000:]}"
    return path


@pytest.fixture()
def new_store(empty_store_file) -> Callable[[Path], str]:
    """new_store(path): a copy of the session's empty store at `path` (its folder made), and its `sqlite:///` URI:
    for tests of what is logged and registered, not of how a store is first made (the tests that check that name a
    path where no store is)."""

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(empty_store_file, path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture(autouse=True, scope="session")
def _gate_settles_at_once():
    """The gate reads the alias back GATE_SETTLE_S (1 s) after moving it, for a run registering at the same moment
    to show itself: in this process nothing else registers, and the wait cost the tier a second a promotion (runs
    racing each other, in processes of their own, are the fault suite's, which this does not reach). Session-wide,
    so that module fixtures that register versions do not wait either."""
    from shardwise.integrations import promotion

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(promotion, "GATE_SETTLE_S", 0.0)
        yield


#: fixtures that start a server for their module (an MLflow tracking server over moto's S3): a test that uses one is
#: `slow` (make test-all), the rule of pyproject's markers applied where the fixture, not the test, costs the time
SLOW_FIXTURES = frozenset({"s3_tracking_server"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use a SLOW_FIXTURES server are marked slow."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_cost_model():
    """(model, training report): a small real NeuralCostModel trained once per test session on synthetic
    measurements (costmodel_synthetic) labelled with this machine's hardware kind, so `plan` finds it as this
    machine's champion and `--refine` measures here. For tests that only read it: save, register, plan with it."""
    import pandas as pd
    from costmodel_synthetic import comm_rows, cost_frame, synthetic_tables

    from shardwise.costmodel import TrainConfig, train_cost_model
    from shardwise.profiling import hardware_kind

    here = hardware_kind("cpu")
    frame = pd.concat([cost_frame({"a": synthetic_tables("a", 12, 0)}, {"a": 60}, 0, hardware_kind=here),
                       comm_rows(10, 0, hardware_kind=here)], ignore_index=True)
    return train_cost_model(frame, 0, TrainConfig(epochs=5, comm_epochs=5, progress=False))
