"""The host probe's scan of processes outside the engine (probes/host_procs.py ForeignCpu) on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from diagnose.probes.host_procs import ForeignCpu, descendants, read_all_processes, read_thread_cpu

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 60: pass\n"
IDLE = "import time\ntime.sleep(60)\n"


@pytest.fixture
def busy_and_idle() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    idle = subprocess.Popen([sys.executable, "-c", IDLE])
    yield busy, idle
    for p in (busy, idle):
        p.kill()
        p.wait()


def test_thread_counters_carry_the_core() -> None:
    rows = read_thread_cpu(os.getpid())
    assert rows and all(0 <= r["cpu"] < (os.cpu_count() or 1) * 64 for r in rows)


def test_descendants_follow_the_tree() -> None:
    assert descendants([1], {2: 1, 3: 2, 4: 9, 9: 8}) == {1, 2, 3}
    assert descendants([5], {}) == {5}


def test_scan_names_a_busy_process_outside_the_engine(
        busy_and_idle: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]) -> None:
    busy, idle = busy_and_idle
    scan = ForeignCpu(engine_root=idle.pid, top_n=3, min_cores=0.01)
    assert scan.sample(time.monotonic_ns()) == []  # the first scan only sets the counters
    time.sleep(1.5)  # the machine is shared: the busy loop gets a share of a core, not all of it
    recs = scan.sample(time.monotonic_ns())
    head, rows = recs[0], recs[1:]
    assert head["kind"] == "foreign_scan" and head["processes"] > 2 and head["engine_processes"] == 1
    assert 1 <= len(rows) <= 3
    mine = [r for r in rows if r["pid"] == busy.pid]
    assert mine, f"the busy child is not among the top consumers: {rows}"
    r = mine[0]
    assert set(r) == {"kind", "t0_ns", "t_ns", "pid", "name", "cpu_s", "cpu", "own"}  # no command line
    assert r["name"].startswith("python") and r["own"] is True and r["cpu_s"] > 0.05 and r["cpu"] >= 0
    assert all(x["pid"] != idle.pid for x in rows)  # the engine's tree is never "foreign"
    assert [x["cpu_s"] for x in rows] == sorted((x["cpu_s"] for x in rows), reverse=True)


def test_scan_reads_every_process() -> None:
    procs = read_all_processes()
    assert os.getpid() in procs and procs[os.getpid()][1] == os.getppid()
