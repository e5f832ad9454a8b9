"""Every JSON document the CLI writes carries schema_version (first, where the writer orders the keys), and
docs/json-schemas.md lists it with that version and its top-level keys (diagnose/io/schemas.py)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.io import bundle as bundle_io
from diagnose.io import schemas
from diagnose.io.workload_file import FORMAT_VERSION
from diagnose.reports.document import JSON_SCHEMA_VERSION
from tests.json_docs import check_document, table
from tests.servers.truth import truth_server

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "llama_slots_saturated"
PYSPY_SAMPLE = ROOT / "sample_traces" / "vllm_cpu_healthy"

# the table's documents and the version each one's writer declares
VERSIONS = {
    "analysis": JSON_SCHEMA_VERSION, "comparison": schemas.COMPARISON, "verification": schemas.VERIFICATION,
    "experiment": schemas.EXPERIMENT, "search": schemas.SEARCH, "bundle manifest": bundle_io.SCHEMA_VERSION,
    "parquet schema": schemas.PARQUET_SCHEMA, "perfetto trace": schemas.PERFETTO,
    "speedscope profile": schemas.SPEEDSCOPE, "workload file header": FORMAT_VERSION,
    "readiness": schemas.READINESS,
}


def invoke(*args: str, codes: tuple[int, ...] = (0,)) -> None:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code in codes, (args, r.exit_code, r.output)


def test_dumps_writes_the_version_first_under_sorted_keys() -> None:
    opt = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    doc = {"b": [1, {"z": 1, "a": 2}], "schema_version": 3, "a": None}
    for option in (0, opt, orjson.OPT_SORT_KEYS):
        out = schemas.dumps(doc, option)
        assert json.loads(out) == doc and out.lstrip(b"{ \n").startswith(b'"schema_version"'), out
        assert list(json.loads(out)) == ["schema_version", *(["a", "b"] if option & orjson.OPT_SORT_KEYS
                                                             else ["b", "a"])]
    assert schemas.dumps({"schema_version": 2}, opt) == orjson.dumps({"schema_version": 2}, option=opt)
    assert list(schemas.versioned(4, {"x": 1, "schema_version": 9})) == ["schema_version", "x"]
    assert schemas.versioned(4, {"schema_version": 9})["schema_version"] == 4
    with pytest.raises(ValueError, match="no schema_version"):
        schemas.dumps({"a": 1})


def test_the_docs_list_every_document_with_its_version() -> None:
    rows = table()
    assert set(rows) == set(VERSIONS)
    for name, version in VERSIONS.items():
        assert rows[name]["version"] == version, name
        assert "schema_version" in rows[name]["required"], name


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One of each document the commands write (experiment.json: tests/test_experiment_run.py, slow tier)."""
    t = tmp_path_factory.mktemp("docs")
    invoke("analyze", str(SAMPLE), "-o", str(t / "r.html"), "--json", str(t / "analysis.json"), "-q")
    invoke("compare", str(SAMPLE), str(SAMPLE), "--json", str(t / "comparison.json"), "-q", "--resamples", "200")
    invoke("verify", str(SAMPLE), str(SAMPLE), "--json", str(t / "verification.json"), "-q", "--resamples", "200",
           codes=(0, 7, 8))
    invoke("export", str(SAMPLE), "-f", "perfetto", "-o", str(t / "trace.json"), "-q")
    invoke("export", str(PYSPY_SAMPLE), "-f", "speedscope", "-o", str(t / "stacks.json"), "-q")
    invoke("export", str(SAMPLE), "-f", "parquet", "-o", str(t / "pq"), "-q")
    invoke("workload", str(SAMPLE / "bundle"), "-o", str(t / "workload.jsonl"))
    with truth_server(ttft_ms=5, itl_ms=2) as (url, _):
        invoke("attach", "--url", url, "--find-max-goodput", "-c", "1:2:x2", "--search-steps", "0", "-n", "6",
               "--slo", "ttft_p99=1s", "--baseline", "0", "--no-nvml", "-o", str(t / "search"))
        # the overload check in seconds, not its default minute (4 steps of 10 s after 10 s of capacity)
        invoke("readiness", "--url", url, "-o", str(t / "readiness"), "--cancel-tokens", "64", "--cancel-streams",
               "2", "--overload-step", "0.5", "--overload-capacity-time", "0.5", "--overload-concurrency", "4",
               "--overload-tokens", "8")
    return t


@pytest.mark.parametrize(("name", "file", "first"), [
    ("analysis", "analysis.json", True),
    ("comparison", "comparison.json", True),
    ("verification", "verification.json", True),
    ("perfetto trace", "trace.json", True),
    ("speedscope profile", "stacks.json", True),
    ("parquet schema", "pq/schema.json", True),
    ("search", "search/search.json", True),
    ("bundle manifest", "search/levels/c=1/manifest.json", True),
    ("readiness", "readiness/readiness.json", True),
])
def test_every_document_the_cli_writes_carries_its_schema_version(
        written: Path, name: str, file: str, first: bool) -> None:
    check_document(name, written / file, first=first)


def test_the_workload_file_header_carries_it_and_reads_back(written: Path) -> None:
    head = check_document("workload file header", written / "workload.jsonl", line=True)
    assert head["diagnose_workload"] == head["schema_version"]
    from diagnose.io.workload_file import read_workload

    assert len(read_workload(written / "workload.jsonl").requests) == head["requests"]
