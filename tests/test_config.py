"""`diagnose attach --config FILE` and `--print-config` (diagnose/cli/attach_config.py): the file's options used,
the command line over them, bad files refused with one line naming the key (exit 2), the API key of a file never
written anywhere, the resolved options in the manifest, and --print-config's file read back the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from diagnose.cli.attach import attach
from diagnose.cli.attach_config import config_api_key, resolved_options
from diagnose.cli.main import cli
from diagnose.errors import InputError

DIAG = [sys.executable, "-m", "diagnose"]
KEY = "sk-config-file-key-4f9a1c77"


def ctx_for(*args: str) -> Any:
    return attach.make_context("attach", list(args))


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def test_file_values_are_used_and_the_command_line_overrides_them(tmp_path: Path) -> None:
    f = write(tmp_path, "url: http://127.0.0.1:9\nconcurrency: 4\ninput-tokens: uniform:min=8,max=64\n"
                        "output_tokens: 32\nignore-eos: false\nseed: 3\nburstiness: 2\nstore-text: true\n")
    p = ctx_for("--config", str(f)).params
    assert (p["url"], p["concurrency"], p["input_tokens"], p["output_tokens"]) == (
        "http://127.0.0.1:9", "4", "uniform:min=8,max=64", "32")
    assert (p["ignore_eos"], p["seed"], p["burstiness"], p["store_text"]) == (False, 3, 2.0, True)
    assert ctx_for("--config", str(write(tmp_path, "no-nvml: true\n", "n.yaml"))).params["nvml"] is False
    p = ctx_for("--seed", "9", "--config", str(f), "-c", "16", "--ignore-eos").params  # before or after it
    assert (p["seed"], p["concurrency"], p["ignore_eos"], p["output_tokens"]) == (9, "16", True, "32")
    assert ctx_for().params["seed"] == 0  # no file: the defaults


@pytest.mark.parametrize(("text", "msg"), [
    ("concurency: 3\n", "key 'concurency': unknown (not an attach option"),
    ("seed: abc\n", "key 'seed': expected a whole number, got text"),
    ("burstiness: [1]\n", "key 'burstiness': expected a number, got a list"),
    ("store-text: 1\n", "key 'store-text': expected true or false, got a whole number"),
    ("concurrency: {a: 1}\n", "key 'concurrency': expected a text value, got a mapping"),
    ("api: grpc\n", "key 'api': 'grpc' is not one of"),
    ("duration:\n", "key 'duration': expected a text value, got nothing"),
    ("print-config: true\n", "key 'print-config': not allowed in a config file"),
    ("input-tokens: 5\ninput_tokens: 6\n", "key 'input_tokens': given twice"),
    ("nvml: true\nno-nvml: true\n", "key 'no-nvml': given twice"),
    ("- 1\n", "expected a mapping of attach options (key: value), got a list"),
    ("a: [\n", "c.yaml:2: not YAML"),
    ("seed: 1\nseed: 2\n", ""),  # YAML keeps the last of a repeated key (PyYAML's behaviour): no error
])
def test_bad_files_are_one_line_naming_the_key_and_exit_2(tmp_path: Path, text: str, msg: str) -> None:
    f = write(tmp_path, text)
    res = CliRunner().invoke(cli, ["attach", "--config", str(f), "--print-config"])
    if not msg:
        assert res.exit_code == 0 and "seed: 2" in res.output
        return
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"diagnose: error: --config {f}") and msg in lines[0], lines


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    for f, why in ((tmp_path / "nope.yaml", "not a readable file"), (tmp_path / "bin.yaml", "not UTF-8 text"),
                   (tmp_path, "not a readable file")):
        if f.name == "bin.yaml":
            f.write_bytes(b"seed: \xff\xfe\n")
        with pytest.raises(InputError, match=why):
            ctx_for("--config", str(f))


def test_the_api_key_of_a_file_is_used_but_never_shown(tmp_path: Path) -> None:
    f = write(tmp_path, f"url: http://127.0.0.1:9\napi_key: {KEY}\n")
    ctx = ctx_for("--config", str(f))
    assert config_api_key(ctx) == KEY
    assert config_api_key(ctx_for("--config", str(f), "--api-key-env", "X")) is None  # the command line wins
    rec = resolved_options(ctx)
    assert KEY not in repr(rec) and rec["config"]["api_key"] is True and rec["config"]["keys"] == ["url"]
    res = CliRunner().invoke(cli, ["attach", "--config", str(f), "--print-config"])
    assert res.exit_code == 0 and KEY not in res.output and "api_key" not in res.output
    bad = write(tmp_path, f"api_key: {KEY}\napi_key_env: OPENAI_API_KEY\n", "both.yaml")
    res = CliRunner().invoke(cli, ["attach", "--config", str(bad)])
    assert res.exit_code == 2 and "give api_key or api_key_env, not both" in res.output and KEY not in res.output
    wrong = write(tmp_path, f"api_key:\n  - {KEY}\n", "wrong.yaml")
    res = CliRunner().invoke(cli, ["attach", "--config", str(wrong)])
    assert res.exit_code == 2 and "key 'api_key': expected the API key as text" in res.output
    assert KEY not in res.output
    launch = write(tmp_path, f"api_key: {KEY}\nlaunch: vllm serve m\nurl: http://127.0.0.1:9\n", "launch.yaml")
    res = CliRunner().invoke(cli, ["attach", "--config", str(launch)])
    assert res.exit_code == 2 and "api_key works for a capture with --url" in res.output and KEY not in res.output


def test_print_config_reads_back_as_the_same_options(tmp_path: Path) -> None:
    args = ["--url", "http://user:pw@127.0.0.1:9/v1", "-c", "1,4", "--input-tokens",
            "lognormal:mean=512,stdev=256,min=16,max=2048", "--no-ignore-eos", "--seed", "5", "--slo",
            "ttft_p99=500ms", "--workload", "w.jsonl", "--burstiness", "0.5", "--store-text"]
    res = CliRunner().invoke(cli, ["attach", *args, "--print-config"])
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.output)
    assert data["url"] == "http://127.0.0.1:9/v1" and "pw" not in res.output  # no credentials
    assert data["input-tokens"] == "lognormal:mean=512,stdev=256,min=16,max=2048" and data["ignore-eos"] is False
    assert "force" not in data and "print-config" not in data  # only what was given
    f = write(tmp_path, res.output)
    want = ctx_for(*args).params
    got = ctx_for("--config", str(f)).params
    assert {k: v for k, v in got.items() if k not in ("config", "url")} == {
        k: v for k, v in want.items() if k not in ("config", "url")}


def test_capture_records_the_resolved_options_and_never_the_key(tmp_path: Path) -> None:
    from diagnose.io.bundle import open_bundle
    from tests.servers.truth import truth_server

    with truth_server(ttft_ms=1, itl_ms=1) as (url, _):
        f = write(tmp_path, f"url: {url}\nconcurrency: 2\nnum-requests: 6\nbaseline: 0\nwarmup: 0\nno-nvml: true\n"
                            f"input-tokens: uniform:min=20,max=60\nseed: 4\napi_key: {KEY}\n")
        p = subprocess.run([*DIAG, "attach", "--config", str(f), "--seed", "6", "-o", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert KEY not in p.stderr and KEY not in p.stdout
    for path in (tmp_path / "b").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    m = open_bundle(tmp_path / "b").manifest
    opts = m["options"]
    assert opts["resolved"]["seed"] == 6 and opts["resolved"]["concurrency"] == "2"  # the command line won
    assert opts["resolved"]["input_tokens"] == "uniform:min=20,max=60" and opts["resolved"]["url"] == url
    assert opts["config"]["file"] == str(f) and opts["config"]["api_key"] is True
    assert "seed" not in opts["config"]["keys"] and "input_tokens" in opts["config"]["keys"]
    assert m["workload"]["input_lengths"]["spec"] == "uniform:min=20,max=60" and m["workload"]["seed"] == 6
