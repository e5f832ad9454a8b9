"""What the machine did during a failed test, appended to its report: for tests that measure time (the engine
tier and the ``timing`` tier) a failure under load should say so. Registered by tests/conftest.py for items
marked ``engine`` or ``timing``.

The report section: CPU busy and stolen by the hypervisor over the test, the load average, and the share of the
test's time that tasks stalled on CPU, I/O or memory (/proc/pressure). A busy machine shows as a high "cpu
some" share: the failure is then load's, not the code's, and the test is worth a rerun on an idle machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKERS = ("engine", "timing")


def _measured(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in MARKERS)


def _cpu_times() -> list[int]:
    """The whole machine's CPU jiffies from /proc/stat: user nice system idle iowait irq softirq steal."""
    try:
        with open("/proc/stat") as fh:
            return [int(x) for x in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def _pressure() -> dict[str, int]:
    """Pressure-stall totals (µs) from /proc/pressure: time some task waited for a CPU, for I/O or for memory
    (and for I/O with every task stalled): stalls that CPU shares and steal do not show."""
    out: dict[str, int] = {}
    for res in ("cpu", "io", "memory"):
        try:
            with open(f"/proc/pressure/{res}") as fh:
                for line in fh:
                    kind, *fields = line.split()
                    out[f"{res} {kind}"] = int(dict(f.split("=") for f in fields)["total"])
        except (OSError, ValueError, KeyError):
            continue
    return out


def _host_snapshot() -> tuple[float, list[int], dict[str, int]]:
    return time.monotonic(), _cpu_times(), _pressure()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if _measured(item):
        item.stash[_HOST_AT_START] = _host_snapshot()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed engine test's report says what the machine did meanwhile (these tests measure timing on
    2 shared cores): CPU busy and stolen by the hypervisor over the test, the load average, and the share
    of the test's time that tasks stalled on CPU, I/O or memory (/proc/pressure)."""
    outcome = yield
    rep = outcome.get_result()
    if call.when != "call" or not rep.failed or _HOST_AT_START not in item.stash:
        return
    (t0, cpu0, p0), (t1, cpu1, p1) = item.stash[_HOST_AT_START], _host_snapshot()
    if len(cpu0) != 8 or len(cpu1) != 8:
        return
    d = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    total = sum(d) or 1
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    wall_us = max(1.0, (t1 - t0) * 1e6)
    stalls = ", ".join(f"{k} {(v - p0[k]) / wall_us:.1%}" for k, v in p1.items() if k in p0)
    text = (f"cpu busy {1 - (d[3] + d[4]) / total:.0%}, stolen by the hypervisor {d[7] / total:.1%} "
            f"(over {total} jiffies); loadavg {' '.join(load)}"
            + (f"; share of the test's time stalled (/proc/pressure): {stalls}" if stalls else ""))
    rep.sections.append(("host during this test", text))
    cpu_some = (p1.get("cpu some", 0) - p0.get("cpu some", 0)) / wall_us if "cpu some" in p0 else None
    busy = 1 - (d[3] + d[4]) / total
    if (cpu_some is not None and cpu_some >= BUSY_STALL) or busy >= BUSY_CPU:
        FAILED_UNDER_LOAD.append((item.nodeid, text))


# A machine counts as busy during a test when tasks waited for a CPU this share of its time (/proc/pressure
# "cpu some"), or its CPUs were this busy: the two shared cores of CI stall 10-60% under the engine tier.
BUSY_STALL = 0.20
BUSY_CPU = 0.90
FAILED_UNDER_LOAD: list[tuple[str, str]] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The load check: failed engine/timing tests that ran on a busy machine, said in one place, so a red run
    says when load, not code, may be the cause (rerun them alone on an idle machine before debugging)."""
    if not FAILED_UNDER_LOAD:
        return
    terminalreporter.section("load check")
    terminalreporter.write_line(
        f"{len(FAILED_UNDER_LOAD)} failed timing-sensitive test(s) ran while this machine was busy (CPU stalled "
        f">= {BUSY_STALL:.0%} of the test's time or CPUs >= {BUSY_CPU:.0%} busy): load, not code, may have failed "
        "them; rerun them alone on an idle machine (python -m pytest -m 'timing or engine' NODEID):")
    for nodeid, text in FAILED_UNDER_LOAD:
        terminalreporter.write_line(f"  {nodeid}: {text}")


_HOST_AT_START = pytest.StashKey[tuple[float, list[int], dict[str, int]]]()
