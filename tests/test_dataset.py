"""Datasets from local files (`attach --dataset FILE`; diagnose/capture/datasets.py, probes/load_dataset.py):
ShareGPT conversations and prompts JSONL read as a stream with bad records skipped and counted, lengths
measured by the server's /tokenize (else an estimate the card names), conversations replayed as sessions, text
stored only with --store-text."""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from diagnose.capture.datasets import read_dataset
from diagnose.errors import InputError
from diagnose.probes.load_options import workload_from_options
from tests.load_testserver import TestServer

DIAG = [sys.executable, "-m", "diagnose"]

CONV3 = {"id": "a", "conversations": [
    {"from": "system", "value": "be brief"},
    {"from": "human", "value": "first question here"},
    {"from": "gpt", "value": "first answer with six words"},
    {"from": "human", "value": "second question"},
    {"from": "gpt", "value": "second answer"},
    {"from": "human", "value": "third"},
]}
CONV1 = {"id": "b", "conversations": [{"role": "user", "content": "only one turn"},
                                       {"role": "assistant", "content": "a b c d e f g h"}]}


def sharegpt_file(tmp_path: Path, records: list[Any], name: str = "sg.json") -> Path:
    f = tmp_path / name
    f.write_text(json.dumps(records))
    return f


def test_sharegpt_json_array_turns_answers_and_context(tmp_path: Path) -> None:
    ds = read_dataset(sharegpt_file(tmp_path, [CONV3, CONV1]))
    assert ds.format == "sharegpt" and len(ds.conversations) == 2 and ds.skipped == 0
    c = ds.conversations[0]
    assert c.system == "be brief" and [t[0] for t in c.turns] == ["first question here", "second question", "third"]
    assert [t[1] for t in c.turns] == ["first answer with six words", "second answer", None]
    assert c.messages(1) == [{"role": "system", "content": "be brief"},
                             {"role": "user", "content": "first question here"},
                             {"role": "assistant", "content": "first answer with six words"},
                             {"role": "user", "content": "second question"}]
    assert c.prompt(1) == "be brief\n\nfirst question here\n\nfirst answer with six words\n\nsecond question"
    assert ds.summary() == {"file": str(tmp_path / "sg.json"), "format": "sharegpt", "conversations": 2,
                            "requests": 4, "multi_turn": 1, "skipped": 0, "truncated": False}


def test_bad_records_are_skipped_and_counted_naming_the_first(tmp_path: Path) -> None:
    f = tmp_path / "sg.jsonl"
    f.write_text("\n".join([json.dumps(CONV1), "{not json", json.dumps({"conversations": "x"}),
                            json.dumps({"conversations": [{"from": "gpt", "value": "no user"}]}),
                            json.dumps({"conversations": [{"from": "alien", "value": "hi"}]}),
                            json.dumps(CONV3)]) + "\n")
    ds = read_dataset(f, "sharegpt")
    assert len(ds.conversations) == 2 and ds.skipped == 4
    assert ds.note.startswith(f"{f}: skipped 4 unreadable record(s) (first: {f}:2: not JSON")
    arr = sharegpt_file(tmp_path, [CONV1, 5, {"conversations": []}, CONV3])
    ds = read_dataset(arr)
    assert ds.skipped == 2 and f"{arr}: record 2: not a JSON object" in ds.note


def test_prompts_jsonl_with_output_lengths(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl.gz"
    rows = [{"prompt": "hello there world", "output_tokens": 5}, {"prompt": "x y", "max_tokens": 7},
            {"prompt": "no length"}, {"prompt": ""}, {"prompt": "bad", "output_tokens": 0}, {"text": "what"}]
    f.write_bytes(gzip.compress(("\n".join(json.dumps(r) for r in rows) + "\n").encode()))
    ds = read_dataset(f)
    assert ds.format == "prompts" and [c.output_tokens for c in ds.conversations] == [5, 7, None]
    assert ds.skipped == 3 and f"{f}:4: no prompt" in ds.note


@pytest.mark.parametrize(("body", "fmt", "why"), [
    ("", None, "empty file"),
    ("\n\n", None, "empty file"),
    ('{"prompt": "a"}\n', "sharegpt", ":1: no conversations list"),
    ('{"x": 1}\n', None, ":1: neither a ShareGPT conversation"),
    ("[1, 2", None, "record 1: neither a ShareGPT conversation"),
    ("[{", None, "not JSON"),
])
def test_a_file_with_nothing_usable_is_one_error(tmp_path: Path, body: str, fmt: str | None, why: str) -> None:
    f = tmp_path / "d.json"
    f.write_text(body)
    with pytest.raises(InputError, match=why) as e:
        read_dataset(f, fmt)
    assert "\n" not in str(e.value) and str(e.value).startswith("--dataset ")


def test_missing_file_and_bad_format(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_dataset(tmp_path / "nope.json")
    with pytest.raises(InputError, match="not a regular file"):
        read_dataset(tmp_path)
    with pytest.raises(InputError, match="use sharegpt or prompts"):
        read_dataset(tmp_path / "x", "alpaca")


def test_streamed_with_bounded_memory(tmp_path: Path) -> None:
    """A 12 MB array of which only the last records are usable is read element by element: the peak is the
    records kept, not the file."""
    f = tmp_path / "big.json"
    junk = {"conversations": [{"from": "gpt", "value": "z" * 400}]}  # no user turn: skipped
    with f.open("w") as fh:
        fh.write("[" + ",".join(json.dumps(junk) for _ in range(30_000)) + "," + json.dumps(CONV1) + "]")
    assert f.stat().st_size > 12_000_000
    tracemalloc.start()
    try:
        ds = read_dataset(f)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ds.conversations) == 1 and ds.skipped == 30_000
    assert peak < 2_000_000, peak
    keep = read_dataset(sharegpt_file(tmp_path, [CONV1] * 50), keep=10)
    assert len(keep.conversations) == 10 and keep.truncated


def _options(**kw: Any) -> dict[str, Any]:
    from diagnose.cli.attach import attach

    return {**attach.make_context("attach", ["--url", "http://127.0.0.1:9"]).params, **kw}


@pytest.mark.parametrize(("kw", "why"), [
    ({"workload": Path(__file__).parent / "data" / "workload" / "mooncake_sample.jsonl"}, "drop --dataset"),
    ({"turns": 3}, "drop --turns"),
    ({"shared_prefix": 0.5}, "drop --shared-prefix"),
    ({"input_tokens": "uniform:min=1,max=5"}, "drop the --input-tokens distribution"),
])
def test_options_that_do_not_go_with_a_dataset(tmp_path: Path, kw: dict[str, Any], why: str) -> None:
    o = _options(dataset=sharegpt_file(tmp_path, [CONV1]), **kw)
    with pytest.raises(InputError, match=why):
        workload_from_options(o)
    with pytest.raises(InputError, match="give --dataset"):
        workload_from_options(_options(dataset_format="prompts"))


def run(tmp_path: Path, srv: TestServer, **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    from tests.test_workload import run_with_manifest

    o = _options(baseline=0, warmup=0, **kw)
    spec = workload_from_options(o)
    b = asyncio.run(run_with_manifest(srv, spec, tmp_path / "b"))
    return b, sorted(b.records("requests"), key=lambda r: r["sent_ns"])


def test_conversations_replayed_as_sessions_with_measured_lengths(tmp_path: Path) -> None:
    srv = TestServer()
    b, recs = run(tmp_path, srv, dataset=sharegpt_file(tmp_path, [CONV3, CONV1]), concurrency="2", num_requests=2)
    assert len(recs) == 4 and all(r["ok"] for r in recs)
    sess = sorted((r for r in recs if "session" in r), key=lambda r: r["turn"])
    assert [(r["turn"], r["turns"], r["dataset_index"]) for r in sess] == [(0, 3, 0), (1, 3, 0), (2, 3, 0)]
    for prev, nxt in zip(sess, sess[1:], strict=False):  # each turn after the previous answer
        assert nxt["sent_ns"] >= prev["end_ns"] and nxt["intended_ns"] == prev["end_ns"]
    single = [r for r in recs if "session" not in r]
    assert len(single) == 1 and single[0]["dataset_index"] == 1
    # lengths by the server's /tokenize (the test server: one token a word plus BOS), output from the answers
    prompts = {b["prompt"] for b in srv.bodies if "preflight" not in str(b)}
    ctx2 = "be brief\n\nfirst question here\n\nfirst answer with six words\n\nsecond question"
    assert ctx2 in prompts
    assert [r["prompt_tokens"] for r in sess] == [1 + 5, 1 + 12, 1 + 15]
    assert all(r["prompt_tokens_source"] == "tokenize" for r in recs)
    assert [r["max_tokens"] for r in sess[:2]] == [1 + 5, 1 + 2] and sess[2]["max_tokens"] == 64  # no answer
    assert single[0]["max_tokens"] == 1 + 8
    assert not any("prompt_text" in r for r in recs)  # text only with --store-text
    m = b.manifest
    assert m["workload"]["dataset"]["conversations"] == 2 and "first question" not in json.dumps(m)
    how = m["probes"]["load"]["detail"]["dataset_lengths"]
    assert how["source"] == "tokenize" and how["note"] == "measured by /tokenize: 4 prompts" and how["seconds"] >= 0


def test_estimated_lengths_chat_api_and_store_text(tmp_path: Path) -> None:
    from diagnose.cli.analyze import analysis_json, run_analysis

    srv = TestServer(tokenize=False)
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": "w" * n, "output_tokens": 3}) for n in (40, 80, 120)) + "\n")
    b, recs = run(tmp_path, srv, dataset=f, concurrency="1", num_requests=3, api="chat", store_text=True)
    assert [r["prompt_tokens"] for r in recs] == [10, 20, 30] and {r["prompt_tokens_source"] for r in recs} == {
        "estimate"}
    assert [r["max_tokens"] for r in recs] == [3, 3, 3]
    assert [r["prompt_text"] for r in recs] == ["w" * 40, "w" * 80, "w" * 120]  # --store-text keeps them
    chats = [body["messages"] for body in srv.bodies if body.get("max_tokens") == 3]
    assert chats == [[{"role": "user", "content": "w" * n}] for n in (40, 80, 120)]
    card = analysis_json(run_analysis(tmp_path / "b"))["workload_card"]
    assert card["source"].startswith(f"dataset {f} (prompts): 3 records; input lengths an estimate: estimated "
                                      "(4 characters a token)")
    assert card["dataset"]["lengths"].startswith("an estimate")


def test_open_loop_cycles_through_the_records(tmp_path: Path) -> None:
    srv = TestServer()
    _, recs = run(tmp_path, srv, dataset=sharegpt_file(tmp_path, [CONV1, CONV3]), rate="50", num_requests=4,
                  arrival="constant")
    assert [r["dataset_index"] for r in recs if r.get("turn", 0) == 0] == [0, 1, 0, 1]
    assert sorted({r["dataset_pass"] for r in recs}) == [0, 1] and len(recs) == 8


def test_attach_warns_of_skipped_records_and_refuses_an_unusable_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text("nope\n")
    p = subprocess.run([*DIAG, "attach", "--url", "http://127.0.0.1:9", "--dataset", str(f)],
                       capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"diagnose: error: --dataset {f}:1: not JSON (")
    g = tmp_path / "some.jsonl"
    g.write_text('{"prompt": "a b"}\n{"prompt": 5}\n')
    p = subprocess.run([*DIAG, "attach", "--url", "http://127.0.0.1:9", "--dataset", str(g), "--timeout", "1s"],
                       capture_output=True, text=True, timeout=60)
    assert f"warning: {g}: skipped 1 unreadable record(s) (first: {g}:2: no prompt (a non-empty text))" in p.stderr


def test_an_experiments_warm_up_run_sends_the_same_dataset() -> None:
    import diagnose.runs.experiment as er

    w = er.warmup_args(["-c", "4", "--dataset", "d.json", "--dataset-format", "sharegpt", "-n", "9"], 10)
    assert w[:6] == ["-c", "4", "--dataset", "d.json", "--dataset-format", "sharegpt"] and "-n" not in w


def test_a_fifo_is_never_opened_as_a_dataset_config_or_histogram(tmp_path: Path) -> None:
    import os

    from diagnose.capture.lengths import parse_lengths
    from diagnose.cli.attach_config import read_config

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_dataset(fifo)
    with pytest.raises(InputError, match="not a readable file"):
        read_config(fifo)
    with pytest.raises(InputError, match="is not a readable file"):
        parse_lengths(f"histogram:{fifo}", "--input-tokens")


def test_a_dataset_capture_writes_back_as_a_workload_file(tmp_path: Path) -> None:
    """`diagnose workload` on a dataset capture: each request's measured lengths and its conversation's session
    and turn, so a replay sends the same sizes in the same order (never the text)."""
    from diagnose.io.workload_file import from_bundle

    b, recs = run(tmp_path, TestServer(), dataset=sharegpt_file(tmp_path, [CONV3, CONV1]), concurrency="2",
                  num_requests=2)
    reqs, _, _ = from_bundle(b)
    assert sorted((r.input_tokens, r.output_tokens, r.session, r.turn) for r in reqs) == sorted(
        (r["prompt_tokens"], r["max_tokens"], r.get("session"), r.get("turn")) for r in recs)
    assert sum(1 for r in reqs if r.session is not None) == 3
