"""py-spy probe against a real Python process (tests/host_data/spin_target.py) with the real py-spy."""

from __future__ import annotations

import asyncio
import math
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnose.analysis import Window
from diagnose.io.bundle import Bundle, open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.normalize import host
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.pyspy import PTRACE_FIX, PySpyProbe, parse_raw, pyspy_binary
from diagnose.reports.sections.host import sections as host_sections
from tests.test_host_normalize import stage2

TARGET = Path(__file__).parent / "host_data" / "spin_target.py"
pytestmark = pytest.mark.skipif(pyspy_binary() is None, reason="py-spy not installed")


@pytest.fixture
def target() -> Iterator[tuple[subprocess.Popen[str], int]]:
    p = subprocess.Popen([sys.executable, str(TARGET)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    port = int(p.stdout.readline())
    yield p, port
    p.kill()
    p.wait()


def capture(tmp_path: Path, probe: PySpyProbe, target: Target, seconds: float,
            until_exit: subprocess.Popen[str] | None = None) -> tuple[ProbeStatus, Bundle]:
    """Run the probe for ``seconds`` (or, with ``until_exit``, until that process has exited + ``seconds``)."""
    bw = BundleWriter(tmp_path / "b")
    ctx = CaptureContext(bundle=bw, target=target, stop=asyncio.Event())

    async def go() -> ProbeStatus:
        async def stop() -> None:
            if until_exit is not None:
                for _ in range(600):  # the machine may be loaded: wait for the exit itself
                    if until_exit.poll() is not None:
                        break
                    await asyncio.sleep(0.1)
            await asyncio.sleep(seconds)
            ctx.stop.set()
        st, _ = await asyncio.gather(probe.run(ctx), stop())
        return st

    status = asyncio.run(go())
    bw.set_probe_status(status)
    bw.finish()
    return status, open_bundle(tmp_path / "b")


def test_samples_threads_and_categorises(tmp_path: Path, target: tuple[subprocess.Popen[str], int]) -> None:
    proc, _ = target
    status, b = capture(tmp_path, PySpyProbe(pid=proc.pid, rate_hz=50, dump_interval_s=0.5, cpu_interval_s=0.25),
                        Target(url="http://127.0.0.1:9"), 2.5)
    assert status.state == "ok", status.reason
    assert status.detail["samples"] > 50
    assert status.detail["pyspy_cpu_s"] > 0  # py-spy's own cost is measured
    t = host.tables(b)
    cats = t["host_stacks"].groupby(["thread", "category"])["samples"].sum()
    assert cats[("spinner", "spin_wait")] > 0.9 * cats.loc["spinner"].sum()
    assert cats[("cruncher", "model_forward")] > 0
    assert not t["host_threads"].empty and not t["host_dumps"].empty
    assert len(t["host_foreign_scans"]) >= 1  # the scan of other processes ran (its last interval ends at the stop)
    assert (t["host_threads"]["core"] >= 0).all()  # each thread's core is recorded
    s = {x.name: x for x in host.signals(t, Window(0.0, math.inf))}
    # the spinner burns CPU, but in spin-wait: it is never the "saturated" (useful work) thread
    assert s["host_thread_busy_max_ratio"].value > 0.05  # the machine is shared: keep it loose
    assert s["host_thread_saturated_max_ratio"].value <= s["host_thread_busy_max_ratio"].value
    assert "spinner" not in s["host_thread_saturated_max_ratio"].description
    assert s["host_spin_wait_share_ratio"].value > 0.1
    assert len(s["host_thread_saturated_max_ratio"].series) >= 3
    assert 0.0 <= s["host_cpu_steal_or_contention_ratio"].value < 1.0
    assert (tmp_path / "b" / "artifacts" / f"pyspy_{proc.pid}.txt").exists()
    ids = {x.id for x in host_sections(stage2(t))}
    assert {"host_processes", "host_categories", "host_threads", "host_flamegraph", "host_pyspy_cost"} <= ids


def test_discovers_pid_from_listening_port(tmp_path: Path, target: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = target
    # default settings (a float rate: py-spy wants an integer on its command line)
    status, b = capture(tmp_path, PySpyProbe(), Target(url=f"http://127.0.0.1:{port}"),
                        1.0)
    assert status.state == "ok", status.reason
    assert list(status.detail["processes"]) == [str(proc.pid)]
    assert status.detail["samples"] > 0


def test_nothing_on_port_is_unavailable(tmp_path: Path) -> None:
    status, _ = capture(tmp_path, PySpyProbe(), Target(url="http://127.0.0.1:18599"), 0.1)
    assert status.state == "unavailable" and "18599" in status.reason


def test_pyspy_missing_is_unavailable(tmp_path: Path) -> None:
    status, _ = capture(tmp_path, PySpyProbe(pid=os.getpid(), binary=str(tmp_path / "no-py-spy")),
                        Target(url="http://127.0.0.1:9"), 0.1)
    assert status.state == "unavailable" and "py-spy is not installed" in status.reason


def test_refused_ptrace_is_failed_with_fix(tmp_path: Path, target: tuple[subprocess.Popen[str], int]) -> None:
    # FAKE py-spy: as root here ptrace is never refused, so a stand-in prints py-spy's refusal and exits 1
    fake = tmp_path / "fake-py-spy-refused"
    fake.write_text("#!/bin/sh\necho 'Error: Permission Denied: Operation not permitted (os error 1)' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    proc, _ = target
    status, _ = capture(tmp_path, PySpyProbe(pid=proc.pid, binary=str(fake), dump_interval_s=0),
                        Target(url="http://127.0.0.1:9"), 0.6)
    assert status.state == "failed"
    assert "Permission Denied" in status.reason and PTRACE_FIX in status.reason


def test_process_exiting_mid_capture_is_recorded(tmp_path: Path) -> None:
    # the target lives 2.5 s: in the full unit suite on 2 loaded cores a target living 1 s once ended the probe
    # "failed" (py-spy took no sample before the exit, or the probe began after it); the exit mid-capture,
    # with samples from before it, is what is tested here
    p = subprocess.Popen([sys.executable, str(TARGET), "--exit-after", "2.5"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    p.stdout.readline()
    try:
        status, b = capture(tmp_path, PySpyProbe(pid=p.pid, rate_hz=50, cpu_interval_s=0.2, dump_interval_s=0),
                            Target(url="http://127.0.0.1:9"), 1.0, until_exit=p)
    finally:
        p.kill()
        p.wait()
    assert status.state == "ok"
    assert "exited during the capture" in status.reason
    assert any(r["kind"] == "exit" and r["pid"] == p.pid for r in b.records("host_samples"))
    assert status.detail["samples"] > 0  # what py-spy saw before the exit is kept


def test_parse_raw() -> None:
    text = ("thread (12): MainThread;a (x.py);b (y.py) 7\n"
            "thread (13);c (z.py) 2\n"
            "garbage line\n")
    assert parse_raw(text) == [(12, "MainThread", ["a (x.py)", "b (y.py)"], 7), (13, "", ["c (z.py)"], 2)]
