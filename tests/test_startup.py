"""Start-up cost: `diagnose --version` and `--help` import no pandas or numpy (a real check, not a timing).

Each case runs in a fresh interpreter, as a user runs the command; benchmarks/startup.py measures the times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("pandas", "numpy")
PROBE = f"HEAVY = {HEAVY!r}\n" + """
import json, sys
from diagnose.cli.main import cli
args = json.loads(sys.argv[1])
code = 0
try:
    cli(args, prog_name="diagnose", standalone_mode=True)
except SystemExit as e:
    code = e.code
sys.stdout.flush()
print("\\n" + json.dumps({"code": code, "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def loaded_after(args: list[str]) -> dict[str, object]:
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["analyze", "--help"], ["attach", "--help"],
                                  ["rules", "--help"], ["run", "--help"]], ids=" ".join)
def test_cli_start_imports_no_pandas_or_numpy(args: list[str]) -> None:
    out = loaded_after(args)
    assert out["code"] == 0
    assert out["heavy"] == [], f"`diagnose {' '.join(args)}` imported {out['heavy']}"


def test_importing_the_cli_imports_no_pandas_or_numpy() -> None:
    code = f"import sys, diagnose.cli.main; print([m for m in {HEAVY!r} if m in sys.modules])"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_the_probe_does_see_pandas_when_a_command_needs_it(tmp_path: Path) -> None:
    """The check above could pass by never looking: here a command that does need pandas must show it."""
    sample = Path(__file__).resolve().parent.parent / "sample_traces" / "vllm_cpu_healthy"
    out = loaded_after(["analyze", str(sample), "-q", "-o", str(tmp_path / "r.html")])
    assert out["code"] == 0 and "pandas" in out["heavy"]  # type: ignore[operator]
