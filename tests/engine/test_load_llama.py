"""Drawn lengths and a dataset against a real llama-server (the tiny GGUF model; harness/llama_server.py): the
lengths diagnose records as planned are the server's own prompt token counts (issue 36 item 4).

A lognormal input distribution (synthetic prompts calibrated with llama-server's /tokenize) and a small prompts
JSONL of natural text measured with /tokenize: every request's planned prompt_tokens equals the server's
usage.prompt_tokens, and the drawn lengths are the seeded draws.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnose.capture.lengths import LengthDraws, parse_lengths
from diagnose.io.bundle import open_bundle
from harness.llama_server import LlamaServer, ensure_llama

DIAG = [sys.executable, "-m", "diagnose"]
INPUT = "lognormal:mean=200,stdev=120,min=16,max=600"
OUTPUT = "uniform:min=4,max=16"
N = 24


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    ensure_llama()
    with LlamaServer(n_parallel=2, log_path=tmp_path_factory.mktemp("llama") / "server.log") as server:
        yield server


def attach(url: str, out: Path, *args: str) -> list[dict[str, Any]]:
    p = subprocess.run([*DIAG, "attach", "--url", url, "-c", "2", "--baseline", "0", "--warmup", "0", "--no-nvml",
                        "-o", str(out), *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return list(open_bundle(out).records("requests"))


@pytest.mark.engine
def test_lognormal_lengths_are_the_servers_prompt_token_counts(llama: LlamaServer, tmp_path: Path) -> None:
    recs = attach(llama.url, tmp_path / "b", "-n", str(N), "--input-tokens", INPUT, "--output-tokens", OUTPUT,
                  "--seed", "3")
    assert len(recs) == N and all(r["ok"] for r in recs)
    assert {r["prompt_tokens_source"] for r in recs} == {"tokenize"}  # llama-server's /tokenize calibrated them
    assert [r["prompt_tokens"] for r in recs] == [r["prompt_tokens_usage"] for r in recs]  # the server's own count
    ins = LengthDraws(parse_lengths(INPUT, "--input-tokens"), 3, "input")
    outs = LengthDraws(parse_lengths(OUTPUT, "--output-tokens"), 3, "output")
    assert sorted(r["prompt_tokens"] for r in recs) == sorted(ins(i) for i in range(N))
    assert sorted(r["max_tokens"] for r in recs) == sorted(outs(i) for i in range(N))
    assert [r["output_tokens_usage"] for r in recs] == [r["max_tokens"] for r in recs]  # ignore_eos honoured
    assert len({r["prompt_tokens"] for r in recs}) > N // 2
    m = open_bundle(tmp_path / "b").manifest
    assert m["workload"]["input_lengths"]["spec"] == INPUT and m["workload"]["seed"] == 3
    p = subprocess.run([*DIAG, "analyze", str(tmp_path / "b"), "--json", str(tmp_path / "a.json"), "-o",
                        str(tmp_path / "r.html")], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 5), p.stderr
    card = json.loads((tmp_path / "a.json").read_text())["workload_card"]
    assert "input tokens lognormal, mean 200, stdev 120, 16 to 600" in card["source"]
    assert card["fidelity"]["input_served_over_planned_p50"] == 1.0


@pytest.mark.engine
def test_a_prompts_dataset_is_measured_with_tokenize(llama: LlamaServer, tmp_path: Path) -> None:
    texts = ["Write a haiku about the sea.",
             "Explain, in three short paragraphs, why the sky looks blue at noon and red at sunset.",
             "List five prime numbers greater than one hundred, then add them up and show the sum.",
             "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n# what does this return for 10?",
             "Translate to French: the cat sleeps on the warm windowsill while the rain falls outside.",
             "Summarise: " + "The committee met on Tuesday to review the budget. " * 12]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": t, "output_tokens": 4 + i}) + "\n" for i, t in enumerate(texts)))
    conv = {"conversations": [{"from": "human", "value": "What is a prime number?"},
                              {"from": "gpt", "value": "A whole number above one with no divisors but one and "
                                                       "itself."},
                              {"from": "human", "value": "Give me two examples."}]}
    g = tmp_path / "c.json"
    g.write_text(json.dumps([conv]))
    recs = attach(llama.url, tmp_path / "b", "-n", str(len(texts)), "--dataset", str(f))
    assert len(recs) == len(texts) and all(r["ok"] for r in recs)
    assert {r["prompt_tokens_source"] for r in recs} == {"tokenize"}
    assert [r["prompt_tokens"] for r in recs] == [r["prompt_tokens_usage"] for r in recs]
    assert sorted(r["max_tokens"] for r in recs) == [4 + i for i in range(len(texts))]
    assert len({r["prompt_tokens"] for r in recs}) == len(texts)
    # a conversation of two turns: the second sent after the first answer, its context measured exactly
    recs = sorted(attach(llama.url, tmp_path / "c", "-n", "1", "--dataset", str(g)), key=lambda r: r["turn"])
    assert [r["turn"] for r in recs] == [0, 1] and recs[1]["sent_ns"] >= recs[0]["end_ns"]
    assert [r["prompt_tokens"] for r in recs] == [r["prompt_tokens_usage"] for r in recs]
    assert recs[1]["prompt_tokens"] > recs[0]["prompt_tokens"] + recs[0]["max_tokens"] - 1


@pytest.mark.engine
def test_scrapes_behind_a_proxy_are_charged_only_the_servers_time(llama: LlamaServer, tmp_path: Path) -> None:
    """Issue 36, client defect 2, on the real engine: llama-server behind a proxy adding an 80 ms round trip,
    a 20 s capture at the default 1% overhead budget and 1 s interval. Charged the round trip (80+ ms a
    scrape, 8% of a core at 1 s), the budget stretched the interval to 10 s; charged the server's time, it
    scrapes every second."""
    import asyncio
    import threading
    from urllib.parse import urlsplit

    from tests.test_prometheus_rtt import delaying_proxy

    port = urlsplit(llama.url).port
    assert port is not None
    ready: dict[str, Any] = {}
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        async with delaying_proxy(port, 0.04) as pport:
            ready["port"] = pport
            ready["stop"] = asyncio.Event()
            await ready["stop"].wait()

    t = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    t.start()
    try:
        for _ in range(100):
            if "stop" in ready:
                break
            threading.Event().wait(0.05)
        url = f"http://127.0.0.1:{ready['port']}"
        p = subprocess.run([*DIAG, "attach", "--url", url, "-c", "1", "-d", "20s", "--baseline", "0", "--no-nvml",
                            "--input-tokens", "32", "--output-tokens", "8", "-o", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=300)
    finally:
        if "stop" in ready:
            loop.call_soon_threadsafe(ready["stop"].set)
        t.join(10)
    assert p.returncode == 0, p.stderr
    b = open_bundle(tmp_path / "b")
    st = b.manifest["probes"]["prometheus"]["detail"]
    assert st["round_trip_ms"] >= 76, st
    assert st["cost"]["target_ms"] / st["scrapes_ok"] < 40, st["cost"]
    assert st["cost"].get("adapted") is None and st["scrapes_ok"] >= 18, st
