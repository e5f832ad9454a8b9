"""The Python API (diagnose/api/, docs/api.md): capture() runs attach in process against real servers and
returns the bundle; analyze() returns the typed frozen Analysis; report() and document() write what the CLI
writes; bad options are the CLI's one-line errors raised as diagnose.errors exceptions; an API key is sent and
never stored."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from diagnose import api
from diagnose.analysis import Analysis
from diagnose.errors import BundleError, DiagnoseError, InputError, TargetError
from diagnose.io.bundle import open_bundle
from tests.servers.faults import fault_server
from tests.servers.truth import free_port, truth_server

KEY = "sk-api-test-key-8d2e61f0"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("api") / "b"
    policy = asyncio.get_event_loop_policy()
    with truth_server(ttft_ms=5, itl_ms=2) as (url, _):
        got = api.capture(url=url, output=out, num_requests=12, concurrency=2, baseline=0, output_tokens=8,
                          input_tokens="uniform:min=16,max=64", nvml=False)
    assert got == out
    # the caller's event loop policy as it was: the capture ran a uvloop loop of its own, not the process's policy
    assert asyncio.get_event_loop_policy() is policy
    return out


def test_capture_returns_the_bundle_with_the_options_given(bundle: Path) -> None:
    b = open_bundle(bundle)
    resolved = b.manifest["options"]["resolved"]
    assert (resolved["concurrency"], resolved["num_requests"], resolved["nvml"]) == ("2", 12, False)
    assert resolved["input_tokens"] == "uniform:min=16,max=64"
    reqs = [r for r in b.records("requests") if not r["warmup"]]
    assert len(reqs) >= 12 and all(r["ok"] for r in reqs)
    assert len({r["prompt_tokens"] for r in reqs}) > 1  # the distribution was drawn, not one fixed length


def test_analyze_report_and_document_match_the_cli(bundle: Path, tmp_path: Path) -> None:
    a = api.analyze(bundle)
    assert isinstance(a, Analysis)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.findings = []  # type: ignore[misc]
    html = api.report(a, tmp_path / "r.html")
    assert html == tmp_path / "r.html" and "<html" in html.read_text()[:500].lower()
    doc = api.document(a)
    assert next(iter(doc)) == "schema_version"
    p = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(bundle), "-o", str(tmp_path / "c.html"),
                        "--json", str(tmp_path / "c.json"), "-q"], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 5), p.stderr  # 5: the run was judged invalid (a loaded machine); --json is written
    cli_doc = json.loads((tmp_path / "c.json").read_text())
    ours = orjson.loads(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS))
    assert ours == cli_doc


def test_analyze_options_and_errors(bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        api.analyze(tmp_path / "missing")
    with pytest.raises(InputError, match="unknown threshold"):
        api.analyze(bundle, thresholds={"no_such_threshold": 1.0})
    with pytest.raises(InputError, match="expected a number"):
        api.analyze(bundle, thresholds={"x": "high"})  # type: ignore[dict-item]
    with pytest.raises(InputError, match="cost-per-hour"):
        api.analyze(bundle, cost_per_hour="cheap")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DiagnoseError):
        api.analyze(tmp_path / "empty")
    assert api.analyze(bundle).workload_card is not None
    priced = api.analyze(bundle, cost_per_hour="1.8x2")  # the price given, not the one recorded (none)
    assert priced.workload_card is not None and priced.workload_card["cost"]["price_per_hour"] == pytest.approx(3.6)
    strict = api.analyze(bundle, thresholds={"client_loop_lag_max_ms": 0.5})
    assert strict.thresholds["client_loop_lag_max_ms"] == 0.5


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"concurency": 4}, InputError, "unknown option 'concurency' (did you mean concurrency?)"),
    ({"concurrency": "x"}, InputError, "bad concurrency list 'x'"),
    ({"store_text": "yes"}, InputError, "store_text is a flag (--store-text): give True or False"),
    ({"duration": "5q"}, InputError, "bad duration '5q'"),
    ({"seed": "abc"}, InputError, "'abc' is not a valid integer"),
    ({"api": "grpc"}, InputError, "'grpc' is not one of"),
    ({"concurrency": [1, 2]}, InputError, "concurrency (--concurrency) takes text, a number or a path, got list"),
    ({"print_config": True}, InputError, "unknown option 'print_config'"),
    ({"num_requests": 2}, TargetError, "connection refused"),
])
def test_capture_refuses_bad_options_with_the_cli_one_line_error(
        tmp_path: Path, options: dict[str, Any], error: type[Exception], message: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(error) as e:
        api.capture(url=url, output=tmp_path / "b", **options)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "b").exists()  # nothing written for an option refused before it connects


def test_capture_refuses_to_run_inside_an_event_loop(tmp_path: Path) -> None:
    async def inside() -> None:
        api.capture(url="http://127.0.0.1:9", output=tmp_path / "b")

    with pytest.raises(InputError, match="asyncio.to_thread"):
        asyncio.run(inside())


def test_api_key_is_sent_and_never_stored(tmp_path: Path) -> None:
    log = tmp_path / "seen.jsonl"
    with fault_server("--mode", "ok", "--log", str(log)) as (url, _):
        with pytest.raises(InputError, match="not both"):
            api.capture(url=url, output=tmp_path / "x", api_key=KEY, api_key_env="SOME_VAR")
        out = api.capture(url=url, output=tmp_path / "b", api_key=KEY, num_requests=4, concurrency=2,
                          baseline=0, warmup=0, nvml=False)
    seen = [json.loads(x) for x in log.read_text().splitlines()]
    assert seen and all(s["auth"] == f"Bearer {KEY}" for s in seen if s["path"] == "/v1/completions")
    for f in out.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f


def test_a_failed_capture_raises_with_the_partial_bundle(tmp_path: Path) -> None:
    with fault_server("--mode", "status", "--status", "500") as (url, _), pytest.raises(api.CaptureFailed) as e:
        api.capture(url=url, output=tmp_path / "b", concurrency=4, duration="3s", baseline=0, warmup=0, nvml=False)
    assert e.value.exit_code == 1 and e.value.path == tmp_path / "b"
    assert isinstance(e.value, DiagnoseError) and "\n" not in str(e.value)
    assert open_bundle(tmp_path / "b").manifest["probes"]["load"]["state"] == "failed"


def test_attach_options_lists_every_keyword() -> None:
    opts = api.attach_options()
    assert opts["input_tokens"] == "--input-tokens" and opts["url"] == "--url" and "print_config" not in opts
    assert opts["nvml"] == "--nvml"
    from click.testing import CliRunner

    from diagnose.cli.main import cli

    r = CliRunner().invoke(cli, ["attach", "-h"])  # listing them left the command's -h as it was
    assert r.exit_code == 0 and "--input-tokens" in r.output, r.output


def test_a_bundle_that_is_not_one_is_a_bundle_error(tmp_path: Path) -> None:
    d = tmp_path / "nb"
    d.mkdir()
    (d / "manifest.json").write_text("{not json")
    with pytest.raises((BundleError, InputError)):
        api.analyze(d)


def test_the_docs_example_runs(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    with truth_server(ttft_ms=5, itl_ms=2) as (url, _):
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "DIAGNOSE_URL": url})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ttft p99: " in p.stdout and "n/a" not in p.stdout, p.stdout
    assert (tmp_path / "api-run" / "manifest.json").is_file() and (tmp_path / "api-run.html").is_file()
