"""Real services on loopback for the integration tests: a free port, an `mlflow server` process, and a server
that answers every request with one HTTP status."""

from __future__ import annotations

import http.server
import os
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


@contextmanager
def mlflow_server(tmp: Path, *, artifacts: str | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    """`mlflow server` on a free loopback port, sqlite backend in `tmp`, artifacts proxied to `artifacts` (default:
    a folder in `tmp`); yields its URL once /health answers, stops it after."""
    port = free_port()
    environ = {**os.environ, **(env or {})}
    environ.pop("MLFLOW_TRACKING_URI", None)
    log_path = tmp / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db",
             "--artifacts-destination", artifacts or str(tmp / "artifacts"), "--serve-artifacts", "--workers", "1"],
            env=environ, stdout=log, stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


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
