"""pyinstrument: the client profiler probe and `diagnose run` (run_under_profiler) on a real asyncio server."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from diagnose.errors import InputError
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.pyinstrument_probe import ClientProfilerProbe, load_summary, redact, run_under_profiler

SERVER = Path(__file__).parent / "host_data" / "tiny_async_server.py"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_client_profile_busy_and_idle(tmp_path: Path, loop: str) -> None:
    """Mostly sleeping between bursts: busy well under 1 on both loops. attach runs on uvloop, whose wait for I/O
    is native code pyinstrument does not see (it showed as Runner.run's self time, busy 0.9993, in CI: a test
    earlier in the same worker had left uvloop's policy installed)."""
    import uvloop

    bw = BundleWriter(tmp_path / "b")
    ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())

    def crunch() -> int:
        return sum(j * j for j in range(30_000))

    async def client() -> None:
        for _ in range(10):
            crunch()
            await asyncio.sleep(0.1)
        ctx.stop.set()

    async def go() -> object:
        st, _ = await asyncio.gather(ClientProfilerProbe().run(ctx), client())
        return st

    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        status = runner.run(go())
    bw.finish()
    assert status.state == "ok"  # type: ignore[attr-defined]
    s = load_summary(tmp_path / "b")
    assert s is not None and 0.0 < s["busy_ratio"] < 0.95  # mostly sleeping between bursts (loose: shared CPU)
    funcs = [t["function"] for t in s["top"]]
    assert any("crunch" in f or "genexpr" in f for f in funcs)
    assert (tmp_path / "b" / "artifacts" / "pyinstrument_client.html").stat().st_size > 1000
    assert "pyinstrument_client.pyisession" in open_bundle(tmp_path / "b").manifest["artifacts"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["fg", "bg"])
def test_run_under_profiler_profiles_the_server(tmp_path: Path, sigint_ignored: bool) -> None:
    # bg: started as a background job, whose SIGINT is ignored and inherited so by the server
    port = _free_port()
    out = tmp_path / "prof"
    result: dict[str, int] = {}

    def run() -> None:
        result["code"] = run_under_profiler([sys.executable, str(SERVER), str(port), "--api-key", "sk-secret"],
                                            str(out))

    # signal handlers can only be installed from the main thread: run it there, drive it from a thread
    def drive() -> None:
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    c.recv(100)
                break
            except OSError:
                time.sleep(0.1)
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(b"GET / HTTP/1.0\r\n\r\n")
                c.recv(100)
        # forwarded to the server as SIGINT. Sent to the main thread: os.kill(getpid) may be taken by this
        # thread, and then the main thread, blocked in the child's pipe read, never runs the handler (a hang)
        signal.pthread_kill(main_ident, signal.SIGINT)

    main_ident = threading.main_thread().ident
    assert main_ident is not None
    t = threading.Thread(target=drive)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint_ignored else None
    try:
        t.start()
        run()
        t.join()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    assert result["code"] == 0
    b = open_bundle(out)
    st = {s.name: s for s in b.probe_statuses()}["pyinstrument"]
    assert st.state == "ok"
    s = load_summary(out)
    assert s is not None and s["who"] == "server"
    assert any(x["function"] in ("busy_work", "<genexpr>") for x in s["top"])
    assert "sk-secret" not in (out / "manifest.json").read_text()
    assert (out / "artifacts" / "pyinstrument_server.html").exists()


def test_run_under_profiler_bad_command(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        run_under_profiler(["no-such-program-xyz"], str(tmp_path / "x"))
    with pytest.raises(InputError, match="give the server command"):
        run_under_profiler([], str(tmp_path / "y"))


def test_server_crash_is_failed_status(tmp_path: Path) -> None:
    bad = tmp_path / "crash.py"
    bad.write_text("import os\nos._exit(3)\n")
    code = run_under_profiler([sys.executable, str(bad)], str(tmp_path / "c"))
    assert code == 3
    st = open_bundle(tmp_path / "c").probe_statuses()[0]
    assert st.state == "failed" and "exited (3)" in st.reason


def test_redact() -> None:
    assert redact(["python", "s.py", "--api-key", "k", "--token=t", "--port", "1"]) == [
        "python", "s.py", "--api-key", "***", "--token=***", "--port", "1"]
