"""Issue 34: a multi-turn workload's shared prefix counts the conversation each turn repeats, so SCH006 can
judge a prefix cache that is off for conversations (vllm-project/vllm#4917, ggml-org/llama.cpp#3738)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from diagnose.normalize.client import conversation_prefix_share


def _reqs(rows: list[tuple[str | None, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"session": s, "turn": t, "prompt_tokens": p, "output_tokens": o} for s, t, p, o in rows])


def test_a_later_turn_repeats_the_previous_prompt_and_answer() -> None:
    # a 3-turn conversation: 256 new tokens a turn, 64-token answers (the prompt is the conversation so far)
    rows = [("a", 1, 256, 64), ("a", 2, 576, 64), ("a", 3, 896, 64)]
    share = conversation_prefix_share(_reqs(rows))
    assert share == pytest.approx((0 + 320 / 576 + 640 / 896) / 3)


def test_sessions_are_apart_and_out_of_order_records_are_sorted() -> None:
    rows = [("b", 2, 200, 10), ("a", 1, 100, 50), ("b", 1, 100, 50), ("a", 2, 300, 10)]
    assert conversation_prefix_share(_reqs(rows)) == pytest.approx((0 + 150 / 300 + 0 + 150 / 200) / 4)


def test_single_turn_requests_retries_and_gaps_share_nothing() -> None:
    assert conversation_prefix_share(_reqs([(None, math.nan, 128, 64)] * 4)) is None  # no sessions
    assert conversation_prefix_share(_reqs([("a", 1, 128, 64), ("b", 1, 128, 64)])) is None  # first turns only
    # a retried turn (same turn twice) and a missing turn (1 -> 3) are no consecutive pair
    assert conversation_prefix_share(_reqs([("a", 1, 100, 50), ("a", 1, 100, 50), ("a", 3, 400, 5)])) is None
    assert conversation_prefix_share(pd.DataFrame()) is None


def test_a_share_is_at_most_one() -> None:
    # a turn whose prompt is shorter than the conversation before it (a client that trims history)
    assert conversation_prefix_share(_reqs([("a", 1, 500, 100), ("a", 2, 300, 10)])) == pytest.approx(0.5)


def test_the_workload_signal_takes_the_larger_of_the_client_prefix_and_the_conversation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.test_client_metrics import make_bundle, req, sigs

    turns = []
    for i, (turn, prompt) in enumerate([(1, 100), (2, 300), (3, 500)]):
        r = req(f"t{i}", 100 * i, 100 * i + 50, first=100 * i + 10, n=100)
        r.update(session="s", turn=turn, turns=3, attempt=1, prompt_tokens=prompt, prompt_tokens_usage=prompt)
        turns.append(r)
    chunks = [{"rid": f"t{i}", "t": [100 * i + 10, 100 * i + 50], "tok": [1, 99]} for i in range(3)]
    tables, _ = make_bundle(tmp_path, turns, chunks)  # the bundle's --shared-prefix is 0.25
    want = (0 + 200 / 300 + 400 / 500) / 3
    assert sigs(tables)["workload_shared_prefix_ratio"] == pytest.approx(want)
    single, _ = make_bundle(tmp_path / "one", [req("r", 0, 50, first=10, n=5)], [{"rid": "r", "t": [10], "tok": [5]}])
    assert sigs(single)["workload_shared_prefix_ratio"] == pytest.approx(0.25)  # no conversation: the client's
