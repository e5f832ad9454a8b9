"""The test tiers (issue 39): the lists behind them name tests that exist, and tools/tiers.py reads a
durations log as pytest prints it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import TIERS_FILE, TIMING
from tools.tiers import slow_tests

ROOT = Path(__file__).resolve().parent.parent


def _exists(nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    name = rest.split("[", 1)[0].split("::")[-1]
    f = ROOT / path
    return f.is_file() and re.search(rf"^\s*(async )?def {re.escape(name)}\(", f.read_text(), re.M) is not None


def test_every_listed_test_exists() -> None:
    slow = json.loads(TIERS_FILE.read_text())["slow"]
    assert len(slow) > 100
    missing = [n for n in [*slow, *TIMING] if not _exists(n)]
    assert not missing, f"tests/tiers.json or conftest.TIMING name tests that no longer exist: {missing[:10]}"
    assert not set(slow) & set(TIMING)


def test_the_tool_sums_a_tests_phases_and_keeps_the_fuzz_corpus_out() -> None:
    log = """
============================== slowest durations ===============================
0.40s call     tests/test_a.py::test_x[p1]
0.20s setup    tests/test_a.py::test_x[p1]
0.30s call     tests/test_a.py::test_y
2.00s call     tests/test_fuzz_read.py::test_fuzz_case[3]
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""
    assert slow_tests(log, 0.5) == ["tests/test_a.py::test_x[p1]"]
    assert slow_tests(log, 0.25) == ["tests/test_a.py::test_x[p1]", "tests/test_a.py::test_y"]
