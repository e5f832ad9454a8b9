"""Start tests/servers/truth_server.py on a free loopback port (a real streaming server for CLI tests)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).parent


def answers(url: str, path: str = "/v1/models") -> bool:
    """Whether something answers a GET of ``path`` at ``url`` within a second (a launched server still up)."""
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=1):  # noqa: S310 - a test's local URL
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def truth_server(ttft_ms: float = 5, itl_ms: float = 2, extra: list[str] | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "truth_server.py"), "--port", str(port), "--ttft-ms", str(ttft_ms),
         "--itl-ms", str(itl_ms), "--no-uvloop", *(extra or [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("truth_server did not start") from None
                time.sleep(0.1)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
