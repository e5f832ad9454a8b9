"""A light install (issue 39): Parquet export and the Dask fan-out are extras, scipy is gone, and a feature
whose extra is missing is a one-line error naming it (the other features work without it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.trace import distributed

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "sample_traces" / "vllm_cpu_healthy" / "bundle"
TRACE = ROOT / "tests" / "data" / "traces" / "a100_2rank_nccl_collective_args.json.gz"


def test_the_base_install_has_no_scipy_pyarrow_or_dask_and_the_extras_do() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(meta["dependencies"])
    for heavy in ("scipy", "pyarrow", "dask"):
        assert heavy not in base, heavy
    extras = meta["optional-dependencies"]
    assert any(d.startswith("pyarrow") for d in extras["parquet"])
    assert any(d.startswith("dask[distributed]") for d in extras["scale"])
    assert "diagnose[all]" in extras["dev"] and extras["all"] == ["diagnose[parquet,scale]"]


def test_no_product_module_imports_scipy() -> None:
    hits = [p for root in ("diagnose", "probes", "rules", "reports") for p in (ROOT / root).rglob("*.py")
            if "scipy" in p.read_text(encoding="utf-8").replace("without scipy", "").replace("scipy is not", "")]
    assert hits == []


def test_parquet_export_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed: find_spec says None
    r = CliRunner().invoke(cli, ["export", str(HEALTHY), "--format", "parquet", "-o", str(tmp_path / "t")])
    assert r.exit_code == 2, r.output
    assert "pip install 'diagnose[parquet]'" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "t").exists()


def test_scale_out_without_dask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    cfg = distributed.ScaleOut(workers=None)
    monkeypatch.setattr(distributed, "cores", lambda: 64)
    assert distributed.fans_out(cfg, 64) is False  # automatic: analysed in this process
    for args in (["--workers", "2"], ["--scheduler", "tcp://127.0.0.1:1"]):
        d = tmp_path / args[0].strip("-")
        d.mkdir()
        for i in range(2):
            (d / f"rank{i}.json.gz").write_bytes(TRACE.read_bytes())
        r = CliRunner().invoke(cli, ["analyze", str(d), *args, "-o", str(tmp_path / f"{d.name}.html")])
        assert r.exit_code == 2, r.output
        assert "pip install 'diagnose[scale]'" in r.output and "Traceback" not in r.output, r.output
