"""Real services on loopback for the integration tests: a free port, an `mlflow server` process, and a server
that answers every request with one HTTP status."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (right now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MlflowProcess:
    """`mlflow server` on one loopback port, sqlite backend and artifacts in `tmp`: started, SIGKILLed (the whole
    process group: the server's workers too) and started again on the same port with the same store, as a
    tracking service that crashes and comes back."""

    def __init__(self, tmp: Path, *, artifacts: str | None = None, env: dict[str, str] | None = None) -> None:
        self.tmp, self.artifacts = tmp, artifacts or str(tmp / "artifacts")
        # without MLflow's job runner (GenAI jobs and trace roll-ups, which no test here uses): its huey consumer
        # and checks made each start ~6 s slower on 2 cores (12.9 s against 7.3 s to /health, 2026-11-27)
        self.environ = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
        self.environ.pop("MLFLOW_TRACKING_URI", None)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = tmp / "mlflow.db"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 90) -> str:
        """Start it and wait until /health answers; its URL."""
        self.launch()
        return self.ready(timeout_s)

    def launch(self) -> None:
        """Start the server's process, without waiting for it to answer (`ready` waits)."""
        with (self.tmp / "server.log").open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--backend-store-uri", f"sqlite:///{self.db}",
                 "--artifacts-destination", self.artifacts, "--serve-artifacts", "--workers", "1"],
                env=self.environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def ready(self, timeout_s: float = 90) -> str:
        """Wait until the launched server's /health answers; its URL (the server killed, and RuntimeError with
        its log's end, if it exits or does not answer within `timeout_s`)."""
        assert self.proc is not None, "launch() first"
        log_path = self.tmp / "server.log"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self.url
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"mlflow server did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.3)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the server and its workers (its own session) and wait until they are gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)
        self.proc = None


@contextmanager
def mlflow_server(tmp: Path, *, artifacts: str | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    """`mlflow server` on a free loopback port, sqlite backend in `tmp`, artifacts proxied to `artifacts` (default:
    a folder in `tmp`); yields its URL once /health answers, stops it after."""
    server = MlflowProcess(tmp, artifacts=artifacts, env=env)
    try:
        yield server.start()
    finally:
        server.kill(signal.SIGTERM)


@contextmanager
def status_server(status: int, body: bytes = b"") -> Iterator[str]:
    """An HTTP server on loopback that answers every GET and POST with `status` and `body`; yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if body.startswith(b"{") else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815 - the names http.server calls

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_server() -> Iterator[str]:
    """A port that accepts connections and never answers (a server hung, or a firewall that swallows replies)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # connections complete in the kernel's backlog; nothing ever reads or writes them
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
