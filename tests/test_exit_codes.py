"""Every exit status is documented in `--help`, and an invalid run exits with its own documented status.

The invalid run is checked on a real process (the interpreter's exit status is the subject); the rest run in
this process (tests/cli_inproc.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from diagnose.cli import exits
from tests.cli_inproc import diagnose

ROOT = Path(__file__).resolve().parent.parent
DIAG = [sys.executable, "-m", "diagnose"]
CLIENT_BOUND = ROOT / "sample_traces" / "vllm_cpu_client_bound"
QUEUE_BOUND = ROOT / "sample_traces" / "vllm_cpu_queue_bound"  # valid, with warning-level findings


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DIAG, *args], capture_output=True, text=True, timeout=180)


def documented(help_text: str) -> dict[int, str]:
    """The "Exit status:" block of a --help text as {code: meaning}."""
    assert "Exit status:" in help_text, help_text
    block = help_text.split("Exit status:", 1)[1]
    return {int(m[1]): m[2].strip() for m in re.finditer(r"^\s+(\d+)\s+(\S.*)$", block, re.M)}


def test_top_level_help_documents_every_exit_status() -> None:
    p = diagnose("--help")
    assert p.returncode == 0
    doc = documented(p.stdout)
    assert set(doc) == {c for c, _ in exits.TABLE}
    for code, meaning in exits.TABLE:
        assert doc[code] == meaning
    assert "97" in p.stdout and "diagnose run" in p.stdout.split("Exit status:", 1)[1]


def test_analyze_help_documents_its_exit_statuses() -> None:
    p = diagnose("analyze", "--help")
    assert p.returncode == 0
    doc = documented(p.stdout)
    assert set(doc) == set(exits.ANALYZE_CODES)
    assert "invalid" in doc[exits.INVALID_RUN] and "--fail-on" in doc[exits.FAIL_ON]


def test_every_exit_status_in_the_code_is_in_the_table() -> None:
    """A literal status in the source (exit_code = N, sys.exit(N), Exit(N)) must be one --help documents."""
    table = {c for c, _ in exits.TABLE} | {97}  # 97: `diagnose run`'s child without pyinstrument (in the epilog)
    pat = re.compile(r"(?:exit_code\s*=\s*|sys\.exit\(|Exit\()(\d+)\)?")
    found: dict[int, list[str]] = {}
    for d in ("diagnose", "probes", "rules", "reports"):
        for f in (ROOT / d).rglob("*.py"):
            for m in pat.finditer(f.read_text(encoding="utf-8")):
                found.setdefault(int(m[1]), []).append(str(f.relative_to(ROOT)))
    assert found, "the scan found no exit status at all: the pattern is wrong"
    undocumented = {c: fs for c, fs in found.items() if c not in table}
    assert not undocumented, f"exit statuses not in diagnose/cli/exits.py TABLE: {undocumented}"
    from diagnose.errors import BundleError, DiagnoseError, InputError, TargetError
    from diagnose.reports.render import ReportError

    for cls in (DiagnoseError, BundleError, InputError, TargetError, ReportError):
        assert cls.exit_code in table, cls


def test_an_invalid_run_writes_the_report_then_exits_with_its_status(tmp_path: Path) -> None:
    report, js = tmp_path / "r.html", tmp_path / "f.json"
    p = run("analyze", str(CLIENT_BOUND), "-o", str(report), "--json", str(js))
    assert p.returncode == exits.INVALID_RUN, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout.startswith("Run invalid: the load client was the bottleneck"), p.stdout
    data = json.loads(js.read_text())
    assert data["run_valid"] is False and data["verdict"].startswith("Run invalid")
    assert "Run invalid" in report.read_text(encoding="utf-8")
    # the invalid status wins over --fail-on: no finding of an invalid run is a result to gate on
    p = run("analyze", str(CLIENT_BOUND), "-q", "--fail-on", "critical", "-o", str(tmp_path / "r2.html"))
    assert p.returncode == exits.INVALID_RUN and p.stdout == "", p.stdout + p.stderr
    assert (tmp_path / "r2.html").exists()


def test_a_valid_run_exits_zero_and_fail_on_still_gates(tmp_path: Path) -> None:
    p = diagnose("analyze", str(QUEUE_BOUND), "-q", "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "f.json"))
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["run_valid"] is True
    assert any(f["severity"] == "warning" for f in data["findings"]), data["findings"]
    p = diagnose("analyze", str(QUEUE_BOUND), "-q", "--fail-on", "warning", "-o", str(tmp_path / "r2.html"))
    assert p.returncode == exits.FAIL_ON, p.stderr
