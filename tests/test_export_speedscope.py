"""`diagnose export --format speedscope`: the py-spy host stacks, validated against speedscope's own schema
(tests/data/speedscope/file-format-schema.json, vendored, MIT) and checked against the bundle's samples."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.errors import DiagnoseError
from diagnose.export import speedscope
from diagnose.normalize import host
from diagnose.pipeline import open_input

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = sorted(p.name for p in (ROOT / "sample_traces").iterdir() if (p / "bundle" / "manifest.json").exists())
# the samples captured with py-spy stacks (llama.cpp's are of a native server: /proc counters, no stacks)
SAMPLES = [s for s in BUNDLES
           if "pyspy" in json.loads((ROOT / "sample_traces" / s / "bundle" / "manifest.json").read_text())["probes"]]
SCHEMA = json.loads((ROOT / "tests" / "data" / "speedscope" / "file-format-schema.json").read_text())
VALIDATOR = jsonschema.Draft6Validator(SCHEMA)


def test_the_schema_check_rejects_what_speedscope_rejects() -> None:
    """The check below could pass by accepting anything: here broken files must fail it."""
    ok: dict[str, Any] = {"$schema": speedscope.SCHEMA_URL, "shared": {"frames": [{"name": "f"}]},
                          "profiles": [{"type": "sampled", "name": "p", "unit": "none", "startValue": 0,
                                        "endValue": 1, "samples": [[0]], "weights": [1]}]}
    VALIDATOR.validate(ok)
    for path, value in ((("profiles", 0, "unit"), "minutes"), (("profiles", 0, "type"), "flame"),
                        (("$schema",), "https://example.org/schema.json"), (("shared", "frames", 0, "name"), 3)):
        bad = copy.deepcopy(ok)
        node: Any = bad
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        assert not VALIDATOR.is_valid(bad), path
    bad = copy.deepcopy(ok)
    del bad["profiles"][0]["weights"]
    assert not VALIDATOR.is_valid(bad)


def test_a_sample_of_a_native_server_has_no_stacks_to_export() -> None:
    native = [s for s in BUNDLES if s not in SAMPLES]
    assert "llama_slots_saturated" in native and len(SAMPLES) >= 8
    with pytest.raises(DiagnoseError, match="no py-spy stacks to export"):
        speedscope.build(open_input(ROOT / "sample_traces" / "llama_slots_saturated"))


@pytest.mark.parametrize("sample", SAMPLES)
def test_every_sample_exports_one_valid_sampled_profile_per_thread(sample: str) -> None:
    b = open_input(ROOT / "sample_traces" / sample)
    res = speedscope.build(b)
    doc = json.loads(json.dumps(res.doc))  # what a reader gets back from the file
    VALIDATOR.validate(doc)
    st = host.tables(b)["host_stacks"]
    st = st[st["samples"] > 0]
    threads = st.groupby(["pid", "tid"])
    assert len(doc["profiles"]) == threads.ngroups == res.profiles
    rate = b.manifest["probes"]["pyspy"]["detail"]["rate_hz"]
    frames = doc["shared"]["frames"]
    assert len({(f["name"], f.get("file")) for f in frames}) == len(frames) == res.frames  # each frame once
    by_name = {p["name"]: p for p in doc["profiles"]}
    for (pid, tid), g in threads:
        (prof,) = [p for n, p in by_name.items() if f"pid {pid} " in n and n.endswith(f"(tid {tid})")]
        assert str(g["thread"].iloc[0]) in prof["name"]
        assert prof["type"] == "sampled" and prof["unit"] == "seconds"
        assert len(prof["samples"]) == len(prof["weights"]) == len(g)
        assert sum(prof["weights"]) * rate == pytest.approx(int(g["samples"].sum()))
        assert prof["endValue"] == pytest.approx(sum(prof["weights"])) and prof["startValue"] == 0
        # each sample is its stack, root first, through the shared frames
        stacks = sorted(";".join(f"{frames[i]['name']} ({frames[i]['file']})" if "file" in frames[i]
                                 else frames[i]["name"] for i in s) for s in prof["samples"])
        assert stacks == sorted(s or "(no Python frames)" for s in g["stack"])
    assert doc["profiles"][doc["activeProfileIndex"]]["endValue"] == max(p["endValue"] for p in doc["profiles"])


def test_frames_split_function_and_file() -> None:
    assert speedscope.parse_frame("EngineCore.step (vllm/v1/engine/core.py)") == {
        "name": "EngineCore.step", "file": "vllm/v1/engine/core.py"}
    assert speedscope.parse_frame("f (my (copy)/b.py)") == {"name": "f", "file": "my (copy)/b.py"}
    assert speedscope.parse_frame("<native>") == {"name": "<native>"}


def test_cli_writes_the_file_and_a_trace_without_stacks_is_a_one_line_error(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = CliRunner().invoke(cli, ["export", str(ROOT / "sample_traces" / "vllm_cpu_healthy"), "-f", "speedscope",
                                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    VALIDATOR.validate(json.loads(out.read_bytes()))
    trace = ROOT / "tests" / "data" / "traces" / "tiny_inference_rank1.json.gz"
    r = CliRunner().invoke(cli, ["export", str(trace), "-f", "speedscope", "-o", str(tmp_path / "t.json")])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "no py-spy stacks" in lines[0] and str(trace) in lines[0]
    assert not (tmp_path / "t.json").exists()


def test_without_a_recorded_rate_the_weights_are_sample_counts(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "sample_traces" / "vllm_cpu_healthy", tmp_path / "s")
    mf = tmp_path / "s" / "bundle" / "manifest.json"
    m = json.loads(mf.read_text())
    del m["probes"]["pyspy"]["detail"]["rate_hz"]
    mf.write_text(json.dumps(m))
    b = open_input(tmp_path / "s")
    doc = speedscope.build(b).doc
    VALIDATOR.validate(json.loads(json.dumps(doc)))
    assert {p["unit"] for p in doc["profiles"]} == {"none"}
    assert sum(sum(p["weights"]) for p in doc["profiles"]) == int(host.tables(b)["host_stacks"]["samples"].sum())
