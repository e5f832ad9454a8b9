"""The host probe (probes/host_cpu.py): the engine's /proc counters without py-spy, on by default; and the
py-spy probe's counters never thinned out by slow dumps."""

from __future__ import annotations

import math
import stat
import subprocess
import sys
from pathlib import Path

from diagnose.analysis import Window
from diagnose.normalize import host
from diagnose.probes import probe_specs
from diagnose.probes.base import Target
from diagnose.probes.pyspy import PySpyProbe
from tests.test_pyspy_probe import TARGET, capture


def test_counters_without_pyspy_even_for_a_non_python_server(tmp_path: Path) -> None:
    # a shell loop is no Python process and no py-spy exists here: the counters need neither
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        status, b = capture(tmp_path, PySpyProbe(pid=busy.pid, stacks=False, cpu_interval_s=0.2,
                                                 binary=str(tmp_path / "no-py-spy")),
                            Target(url="http://127.0.0.1:9"), 1.5)
    finally:
        busy.kill()
        busy.wait()
    assert status.name == "host" and status.state == "ok", status.reason
    kinds = [r["kind"] for r in b.records("host_samples")]
    assert kinds.count("system_cpu") >= 4 and "thread_cpu" in kinds and "foreign_scan" in kinds
    assert "stack" not in kinds and "dump" not in kinds and "pyspy_cost" not in kinds
    assert not (tmp_path / "b" / "artifacts").exists() or not list((tmp_path / "b" / "artifacts").iterdir())
    t = host.tables(b)
    s = {x.name: x for x in host.signals(t, Window(0.0, math.inf))}
    assert "host_cpu_steal_or_contention_ratio" in s and s["host_thread_busy_max_ratio"].value > 0.3


def test_the_host_probe_runs_by_default_and_stands_aside_for_pyspy() -> None:
    spec = next(s for s in probe_specs() if s.name == "host")
    assert spec.enabled({"host": True, "pyspy": False})
    assert not spec.enabled({"host": True, "pyspy": True})  # py-spy records the same counters itself
    assert not spec.enabled({"host": False, "pyspy": False})


def test_slow_dumps_never_thin_out_the_counters(tmp_path: Path) -> None:
    # FAKE py-spy whose `dump` takes 3 s (a normal-priority child starved on a contended host) and whose
    # `record` writes nothing: before the fix the counters were read in the dump's loop, once per dump
    fake = tmp_path / "slow-py-spy"
    fake.write_text('#!/bin/sh\ncase "$1" in dump) sleep 3; echo "[]";; *) sleep 0.2;; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    p = subprocess.Popen([sys.executable, str(TARGET)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    p.stdout.readline()
    try:
        status, b = capture(tmp_path, PySpyProbe(pid=p.pid, binary=str(fake), cpu_interval_s=0.2,
                                                 dump_interval_s=0.5, window_s=1.0),
                            Target(url="http://127.0.0.1:9"), 2.5)
    finally:
        p.kill()
        p.wait()
    kinds = [r["kind"] for r in b.records("host_samples")]
    assert kinds.count("system_cpu") >= 6, kinds.count("system_cpu")  # 2.5 s at 0.2 s; 1-2 with the old loop
    assert status.name == "pyspy"


def test_a_lost_counter_stream_fails_the_host_probe_not_pyspy(tmp_path: Path) -> None:
    from diagnose.io.bundle import open_bundle

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        status, _ = capture(tmp_path, PySpyProbe(pid=sleeper.pid, stacks=False, cpu_interval_s=0.1),
                            Target(url="http://127.0.0.1:9"), 0.5)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert status.state == "ok"
    (tmp_path / "b" / "host_samples.jsonl").unlink()
    b = open_bundle(tmp_path / "b")
    b.check_streams()
    st = {s.name: s for s in b.probe_statuses()}
    assert st["host"].state == "failed" and "host_samples missing" in st["host"].reason
    assert "pyspy" not in st  # no phantom py-spy probe for a capture that never ran it
