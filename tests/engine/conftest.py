"""Everything under tests/engine/ needs the real vLLM CPU engine: mark it ``engine`` automatically, so
it is deselected from the default (unit) run even if a test module forgets its marker. A test here that
needs no engine (pure harness logic) opts out with ``@pytest.mark.offline``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENGINE_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "offline: a test under tests/engine/ that needs no real engine")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_DIR in Path(str(item.path)).parents and item.get_closest_marker("offline") is None:
            item.add_marker(pytest.mark.engine)


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
    rep.sections.append(("host during this test", (
        f"cpu busy {1 - (d[3] + d[4]) / total:.0%}, stolen by the hypervisor {d[7] / total:.1%} "
        f"(over {total} jiffies); loadavg {' '.join(load)}"
        + (f"; share of the test's time stalled (/proc/pressure): {stalls}" if stalls else ""))))


_HOST_AT_START = pytest.StashKey[tuple[float, list[int], dict[str, int]]]()
