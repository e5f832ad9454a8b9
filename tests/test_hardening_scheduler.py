"""Issue 33, item 5: `diagnose analyze --scheduler ADDR` (Dask) against addresses that are not a scheduler's.

A listener that accepts the connection and never answers is a one-line error (exit 1) within the connect
timeout, not a wait forever; an address that is not tcp://HOST:PORT with a port of 1-65535 is a usage error
(exit 2, one line) before anything connects."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from diagnose.cli.main import cli

TRACES = Path(__file__).parent / "data" / "traces" / "sampled_128rank"

pytestmark = pytest.mark.timeout(90)  # only to catch a hang (the old code waited forever)


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A TCP listener on 127.0.0.1 that accepts connections and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


def _one_line(r: Result) -> str:
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("diagnose: error:"), r.stderr
    return lines[0]


def test_a_listener_that_never_answers_is_one_line_within_the_connect_timeout(silent_listener: str,
                                                                               tmp_path: Path) -> None:
    import dask.config
    import distributed  # noqa: F401 - its defaults loaded first, or leaving the config.set below drops them

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        r = CliRunner().invoke(cli, ["analyze", str(TRACES), "--scheduler", silent_listener,
                                     "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1, r.stderr
    line = _one_line(r)
    assert f"cannot reach the Dask scheduler at {silent_listener}" in line and "Timed out" in line
    assert not (tmp_path / "r.html").exists()


def test_a_listener_that_never_answers_through_the_python_api(silent_listener: str) -> None:
    from diagnose.errors import DiagnoseError
    from diagnose.trace.analyze import analyze_files
    from diagnose.trace.distributed import ScaleOut, scale_out

    files = sorted(TRACES.iterdir())[:2]
    with scale_out(ScaleOut(scheduler=silent_listener, connect_timeout_s=1.0)), \
            pytest.raises(DiagnoseError, match="no answer within 1 s"):
        analyze_files(files)


@pytest.mark.parametrize(("address", "want"), [
    ("", "expected tcp://HOST:PORT"),
    ("garbage", "expected tcp://HOST:PORT"),
    ("udp://127.0.0.1:8786", "not 'udp://'"),
    ("http://127.0.0.1:8786", "not 'http://'"),
    ("tcp://127.0.0.1:0", "port 0 is out of range (1-65535)"),
    ("tcp://127.0.0.1:70000", "port 70000 is out of range (1-65535)"),
    ("tcp://127.0.0.1:-1", "expected tcp://HOST:PORT"),
    ("tcp://:8786", "expected tcp://HOST:PORT"),
    ("tcp://127.0.0.1", "expected tcp://HOST:PORT"),
])
def test_an_address_that_is_not_a_schedulers_is_a_usage_error(address: str, want: str, tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["analyze", str(TRACES), "--scheduler", address, "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert want in _one_line(r)
    assert not (tmp_path / "r.html").exists()
