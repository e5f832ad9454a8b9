"""The load check of the timing and engine tiers (tests/hostload.py): a failed timing-sensitive test that ran
on a busy machine is named in a "load check" section saying load, not code, may have failed it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CONFTEST = f'''
import sys
sys.path.insert(0, {str(REPO)!r})
import tests.hostload as h
h.BUSY_STALL = {{stall}}
h.BUSY_CPU = {{cpu}}
from tests.hostload import pytest_runtest_call, pytest_runtest_makereport, pytest_terminal_summary
'''

TESTS = '''
import pytest

@pytest.mark.timing
def test_measured_and_red():
    assert False

def test_plain_and_red():
    assert False
'''


def _run(tmp_path: Path, stall: float, cpu: float) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST.format(stall=stall, cpu=cpu))
    (tmp_path / "test_x.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    timing: t\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    return p.stdout


def test_a_busy_machine_is_named_for_timing_tests_only(tmp_path: Path) -> None:
    out = _run(tmp_path, -1.0, -1.0)  # any machine counts as busy
    assert "load check" in out and "1 failed timing-sensitive test(s) ran while this machine was busy" in out
    assert "test_measured_and_red: cpu busy" in out
    assert "test_plain_and_red: cpu" not in out  # not timing-sensitive: no load excuse
    assert "host during this test" in out  # the failed test's own report section


def test_an_idle_machine_gets_no_excuse(tmp_path: Path) -> None:
    out = _run(tmp_path, 2.0, 2.0)  # no machine counts as busy
    assert "load check" not in out and "host during this test" in out
