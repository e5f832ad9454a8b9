"""Drawn lengths and a ShareGPT dataset against the real vLLM CPU server (issue 36): the planned prompt lengths
are the server's own counts (usage.prompt_tokens), for synthetic prompts of a lognormal length and for a chat
conversation measured with vLLM's /tokenize (messages, with the chat template)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diagnose.io.bundle import open_bundle

pytestmark = pytest.mark.engine
DIAG = [sys.executable, "-m", "diagnose"]


def attach(url: str, out: Path, *args: str) -> list[dict[str, Any]]:
    p = subprocess.run([*DIAG, "attach", "--url", url, "-c", "2", "--baseline", "0", "--warmup", "0", "--no-nvml",
                        "-o", str(out), *args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    return list(open_bundle(out).records("requests"))


def test_lognormal_and_a_chat_dataset_match_the_servers_counts(vllm_server: Any, tmp_path: Path) -> None:
    recs = attach(vllm_server.url, tmp_path / "a", "-n", "10", "--input-tokens",
                  "lognormal:mean=120,stdev=80,min=16,max=400", "--output-tokens", "uniform:min=2,max=8", "--seed", "1")
    assert len(recs) == 10 and all(r["ok"] for r in recs)
    assert {r["prompt_tokens_source"] for r in recs} == {"tokenize"}
    assert [r["prompt_tokens"] for r in recs] == [r["prompt_tokens_usage"] for r in recs]
    assert [r["output_tokens_usage"] for r in recs] == [r["max_tokens"] for r in recs]
    assert len({r["prompt_tokens"] for r in recs}) >= 6
    conv = {"conversations": [
        {"from": "system", "value": "You answer briefly."},
        {"from": "human", "value": "What is the capital of France?"},
        {"from": "gpt", "value": "Paris is the capital of France."},
        {"from": "human", "value": "And of Italy? Answer in one word."},
        {"from": "gpt", "value": "Rome."},
        {"from": "human", "value": "Thanks."}]}
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(conv) + "\n" + json.dumps({"conversations": [
        {"from": "human", "value": "Write one line about the sea."}, {"from": "gpt", "value": "It breathes."}]}) + "\n")
    recs = attach(vllm_server.url, tmp_path / "d", "-n", "2", "--api", "chat", "--dataset", str(f))
    assert len(recs) == 4 and all(r["ok"] for r in recs)
    assert {r["prompt_tokens_source"] for r in recs} == {"tokenize"}
    assert [r["prompt_tokens"] for r in recs] == [r["prompt_tokens_usage"] for r in recs]
    turns = sorted((r for r in recs if r.get("session")), key=lambda r: r["turn"])
    assert [r["turn"] for r in turns] == [0, 1, 2]
    assert all(b["sent_ns"] >= a["end_ns"] for a, b in zip(turns, turns[1:], strict=False))
    assert turns[0]["prompt_tokens"] < turns[1]["prompt_tokens"] < turns[2]["prompt_tokens"]
