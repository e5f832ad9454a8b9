"""Everything under tests/engine/ needs the real vLLM CPU engine: mark it ``engine`` automatically, so
it is deselected from the default (unit) run even if a test module forgets its marker. A test here that
needs no engine (pure harness logic) opts out with ``@pytest.mark.offline``."""

from __future__ import annotations

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    item.stash[_HOST_AT_START] = _cpu_times()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed engine test's report says what the machine did meanwhile (these tests measure timing on
    2 shared cores): CPU busy and stolen by the hypervisor over the test, and the load average."""
    outcome = yield
    rep = outcome.get_result()
    start = item.stash.get(_HOST_AT_START, [])
    end = _cpu_times()
    if call.when != "call" or not rep.failed or len(start) != 8 or len(end) != 8:
        return
    d = [b - a for a, b in zip(start, end, strict=True)]
    total = sum(d) or 1
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    rep.sections.append(("host during this test", (
        f"cpu busy {1 - (d[3] + d[4]) / total:.0%}, stolen by the hypervisor {d[7] / total:.1%} "
        f"(over {total} jiffies); loadavg {' '.join(load)}")))


_HOST_AT_START = pytest.StashKey[list[int]]()
