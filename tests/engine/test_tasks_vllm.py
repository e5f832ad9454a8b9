"""Tasks against the real vLLM CPU engine (issue 16, item 4): a multi-turn chat workload and an agent's chain
report task-level percentiles beside the per-request ones, and the growing conversation hits the engine's
prefix cache (each turn's prompt begins with the previous turn's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.io.bundle import open_bundle
from tests.engine.test_attach_vllm import _analyze, _attach

pytestmark = pytest.mark.engine


def test_multi_turn_chat_and_an_agent_chain(vllm_server: object, tmp_path: Path) -> None:
    url = vllm_server.url  # type: ignore[attr-defined]
    runs = {
        # chat: 4 turns, 300 ms think time, 64 new tokens a turn, 24-token answers
        "chat": ("--turns", "4", "--think-time", "300ms", "--api", "chat"),
        # an agent: 6 steps, 50 ms tool calls, a failed step retried twice
        "agent": ("--turns", "6", "--think-time", "50ms", "--retries", "2"),
    }
    for name, args in runs.items():
        out = tmp_path / name
        p = _attach(url, out, "--concurrency", "3", "--duration", "12s", "--input-tokens", "64",
                    "--output-tokens", "24", "--warmup", "1", "--baseline", "2", "--report", str(out / "r.html"),
                    *args)
        assert p.returncode == 0, p.stderr
        turns = int(args[1])
        recs = [r for r in open_bundle(out).iter_records("requests") if r.get("phase") == 1]
        assert recs and all(r.get("turns") == turns for r in recs)
        data = _analyze(out, tmp_path / f"{name}-a")
        assert data["run_valid"] is True, data["verdict"]
        sig = {k: v["value"] for k, v in data["signals"].items()}
        assert sig["tasks_completed"] >= 2, sig.get("tasks_started")
        think = float(args[3].removesuffix("ms")) / 1e3
        # a task is at least its turns' answers and the think times between them
        assert sig["task_latency_p50_ms"] >= (turns - 1) * think * 1e3 + turns * sig["ttft_p50_ms"] * 0.5
        assert sig["task_latency_p50_ms"] > sig["e2e_p50_ms"] * turns
        assert sig["task_rps"] > 0 and sig["tasks_abandoned_ratio"] == 0
        # the context grows: later turns' prompts are longer, and their earlier part is cached
        by_turn = {r["turn"]: r["prompt_tokens_usage"] for r in recs if r.get("prompt_tokens_usage")}
        assert by_turn[turns - 1] > by_turn[0] + (turns - 1) * 64
        # measured 0.32 (chat: the template's tokens after each user message break the shared blocks sooner)
        # and 0.53 (completions); unique single prompts hit about 0. The counter includes the baseline's and
        # the warm-up's requests, which hit nothing.
        assert sig["prefix_cache_hit_ratio"] > (0.15 if name == "chat" else 0.3), sig["prefix_cache_hit_ratio"]
        card = data["workload_card"]
        assert card["arrival"].startswith(f"closed loop of tasks: {turns} turns each")
        html = (out / "r.html").read_text()
        assert "task latency" in html and "tasks per second" in html
