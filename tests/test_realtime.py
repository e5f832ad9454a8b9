"""`attach --realtime`: the load client's loop at SCHED_RR 1 when permitted, recorded in the bundle; at normal
priority with the reason recorded when not (EPERM); the previous policy restored afterwards."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose.capture.realtime import NOT_PERMITTED, RealtimePriority
from diagnose.cli.main import cli
from diagnose.io.bundle import open_bundle
from tests.servers.truth import truth_server


def _rt_permitted() -> bool:
    """Whether this process may set SCHED_RR here (root, CAP_SYS_NICE or RLIMIT_RTPRIO), leaving it as it was."""
    old = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except PermissionError:
        return False
    os.sched_setscheduler(0, old[0], old[1])
    return True


def _deny(*_a: object) -> None:
    raise PermissionError(1, "Operation not permitted")


@pytest.fixture
def loop_policy() -> Iterator[None]:
    """attach leaves the process's event loop policy as it was (it runs a uvloop loop of its own)."""
    old = asyncio.get_event_loop_policy()
    yield
    assert asyncio.get_event_loop_policy() is old


def test_apply_and_restore_on_this_thread() -> None:
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    permitted = _rt_permitted()
    with RealtimePriority() as rt:
        assert rt.info["applied"] is permitted
        assert rt.info["policy"] == "SCHED_RR" and rt.info["priority"] == 1
        if permitted:
            assert os.sched_getscheduler(0) == os.SCHED_RR and os.sched_getparam(0).sched_priority == 1
        else:
            assert rt.info["reason"].startswith(NOT_PERMITTED)
    assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before


def test_eperm_leaves_normal_priority_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    before = os.sched_getscheduler(0)
    monkeypatch.setattr(os, "sched_setscheduler", _deny)
    rt = RealtimePriority()
    info = rt.apply()
    assert info["applied"] is False
    assert info["reason"].startswith("realtime requested but not permitted: Operation not permitted")
    assert "CAP_SYS_NICE" in info["reason"]
    rt.restore()  # nothing to restore: must not call the (denied) setter
    assert os.sched_getscheduler(0) == before


def _attach(url: str, out: Path, *extra: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["attach", "--url", url, "-c", "2", "-d", "1s", "--output-tokens", "8",
                                   "--baseline", "0", "--warmup", "0", "--no-nvml", "--no-metrics", "-o", str(out),
                                   *extra], catch_exceptions=False)
    return res.exit_code, res.output


def test_attach_realtime_is_recorded_in_the_bundle(tmp_path: Path, loop_policy: None) -> None:
    before = os.sched_getscheduler(0)
    permitted = _rt_permitted()
    with truth_server(ttft_ms=2, itl_ms=1) as (url, _):
        code, output = _attach(url, tmp_path / "b", "--realtime")
    assert code == 0, output
    assert os.sched_getscheduler(0) == before  # restored when the capture ended
    b = open_bundle(tmp_path / "b")
    rt = b.manifest["options"]["realtime"]
    assert rt["requested"] is True and rt["policy"] == "SCHED_RR" and rt["priority"] == 1
    assert rt["applied"] is permitted, rt  # root here: permitted
    load = {s.name: s for s in b.probe_statuses()}["load"]
    assert load.state == "ok" and load.detail["realtime"]["applied"] is permitted
    assert (NOT_PERMITTED in load.reason) is (not permitted)
    assert len(b.records("requests")) > 0
    # without the flag nothing is recorded
    with truth_server(ttft_ms=2, itl_ms=1) as (url, _):
        code, output = _attach(url, tmp_path / "plain")
    assert code == 0, output
    plain = open_bundle(tmp_path / "plain")
    assert "realtime" not in plain.manifest["options"]
    assert "realtime" not in {s.name: s for s in plain.probe_statuses()}["load"].detail


def test_attach_realtime_not_permitted_goes_on_at_normal_priority(tmp_path: Path, loop_policy: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_setscheduler", _deny)
    with truth_server(ttft_ms=2, itl_ms=1) as (url, _):
        code, output = _attach(url, tmp_path / "b", "--realtime")
    assert code == 0, output
    assert "warning: realtime requested but not permitted: Operation not permitted" in output
    assert os.sched_getscheduler(0) != os.SCHED_RR
    b = open_bundle(tmp_path / "b")
    rt = b.manifest["options"]["realtime"]
    assert rt["applied"] is False and rt["reason"].startswith(f"{NOT_PERMITTED}: Operation not permitted")
    load = {s.name: s for s in b.probe_statuses()}["load"]
    assert load.state == "ok"
    assert f"{NOT_PERMITTED}: Operation not permitted" in load.reason
    assert len([r for r in b.records("requests") if r["ok"]]) > 0  # the capture went on


def test_help_documents_realtime() -> None:
    res = CliRunner().invoke(cli, ["attach", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "--realtime" in text and "SCHED_RR" in text and "normal priority" in text


def test_probe_children_go_back_to_normal_priority() -> None:
    """Threads inherit the real-time policy; probe child processes (parse worker, py-spy) must not: their CPU
    would be taken straight from the engine. They are started by command line (child_argv), never with a
    preexec_fn (which forks the whole process with the GIL held: benchmarks/fork_stall.py)."""
    import subprocess
    import sys

    from diagnose.capture.realtime import child_argv
    from diagnose.probes.prometheus_worker import ParseWorker

    show = [sys.executable, "-c", "import os, sys; print(os.sched_getscheduler(0), sys.argv[1:])", "a b", "c"]
    permitted = _rt_permitted()
    assert child_argv(show) == show  # at normal priority: unchanged
    with RealtimePriority():
        plain = subprocess.run(show, capture_output=True, text=True, check=True).stdout
        argv = child_argv(show)
        reset = subprocess.run(argv, capture_output=True, text=True, check=True).stdout

        async def worker_policy() -> int:
            w = ParseWorker()
            await w.start()
            try:
                assert w._proc is not None and w._ready is not None
                assert await asyncio.wait_for(w._ready, 60) == b"ready\n"  # past its interpreter's start
                return os.sched_getscheduler(w._proc.pid)
            finally:
                await w.close()

        parser = asyncio.run(worker_policy())
    assert plain == f"{os.SCHED_RR if permitted else os.SCHED_OTHER} ['a b', 'c']\n"
    assert (argv != show) is permitted  # the trampoline only where there is a policy to leave
    assert reset == f"{os.SCHED_OTHER} ['a b', 'c']\n"  # the same arguments, quoting intact
    assert parser == os.SCHED_OTHER
