"""Tasks as the unit of work (issue 16, item 4): multi-turn conversations and agent chains sent by
`attach --turns` (probes/sessions.py), measured end to end (diagnose/normalize/tasks.py) and shown beside the
per-request figures."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diagnose.cli import exits
from diagnose.cli.main import cli
from diagnose.io.bundle import open_bundle
from diagnose.model import Window
from diagnose.normalize import client, tasks
from diagnose.pipeline import analyze
from diagnose.probes.prompts import PromptFactory
from diagnose.probes.sessions import Conversation, TaskPlan, Turn, run_task
from tests.test_client_metrics import make_bundle, req

WHOLE = Window(-math.inf, math.inf)


def _task(session: str, turn: int, turns: int, attempt: int, sent: float, end: float, ok: bool = True,
          error: str | None = None) -> dict[str, Any]:
    r = req(f"{session}-{turn}-{attempt}", sent, end, first=sent + 5 if ok else None, ok=ok, error=error, n=4,
            status=200 if ok else 500)
    return {**r, "session": session, "turn": turn, "turns": turns, "attempt": attempt}


TASKS = [
    # a: three turns, 10 ms think time between them: 0 -> 110 ms
    _task("a", 0, 3, 0, 0, 30), _task("a", 1, 3, 0, 40, 70), _task("a", 2, 3, 0, 80, 110),
    # b: turn 1 failed once, the retry answered: 0 -> 150 ms
    _task("b", 0, 3, 0, 0, 40), _task("b", 1, 3, 0, 50, 55, ok=False, error="http_5xx"),
    _task("b", 1, 3, 1, 55, 100), _task("b", 2, 3, 0, 110, 150),
    # c: turn 1 failed on every attempt: abandoned
    _task("c", 0, 3, 0, 0, 30), _task("c", 1, 3, 0, 40, 45, ok=False, error="http_5xx"),
    _task("c", 1, 3, 1, 45, 50, ok=False, error="http_5xx"),
    # d: cut off by the end of the phase after one turn
    _task("d", 0, 3, 0, 200, 230),
]


def test_task_latency_states_and_retries(tmp_path: Path) -> None:
    t, _ = make_bundle(tmp_path, TASKS, [])
    table = tasks.task_table(t["requests"], WHOLE).set_index("session")
    assert list(table["state"]) == ["complete", "complete", "abandoned", "cut"]
    assert table.loc["a", "latency_ms"] == pytest.approx(110) and table.loc["b", "latency_ms"] == pytest.approx(150)
    assert math.isnan(table.loc["c", "latency_ms"]) and table.loc["b", "attempts"] == 4
    s = {x.name: x.value for x in tasks.signals(t, WHOLE)}
    assert s["tasks_started"] == 4 and s["tasks_completed"] == 2
    assert s["tasks_abandoned_ratio"] == pytest.approx(0.25)
    assert s["task_latency_p50_ms"] == pytest.approx(130) and s["task_latency_max_ms"] == pytest.approx(150)
    assert s["task_retries_total"] == 2
    assert s["task_rps"] == pytest.approx(2 / 0.150)  # two tasks over their 150 ms
    assert "task_goodput_rps" not in s  # no SLO


def test_task_goodput_counts_tasks_whose_every_answer_met_the_slo(tmp_path: Path) -> None:
    """An e2e limit of 35 ms: task a's answers took 30 ms each (within), b's first took 40 ms (not): one of
    the four started tasks is complete and within the SLO."""
    t, _ = make_bundle(tmp_path, TASKS, [], slo={"e2e_p99_ms": 35.0})
    s = {x.name: x.value for x in tasks.signals(t, WHOLE)}
    assert s["task_goodput_ratio"] == pytest.approx(1 / 4)
    assert s["task_goodput_rps"] == pytest.approx(1 / 0.150)


def test_no_tasks_no_signals(tmp_path: Path) -> None:
    t, _ = make_bundle(tmp_path, [req("r1", 0, 20, first=10, n=5)], [])
    assert tasks.signals(t, WHOLE) == []
    assert client.REQUEST_COLUMNS[-4:] == ["session", "turn", "turns", "attempt"]


def test_a_conversation_grows_and_repeats_its_previous_prompt() -> None:
    f = PromptFactory(16, seed=1)
    conv = Conversation(f, "s1", 3, seed=1)
    t0 = conv.prompt(f.make(1), 0, 0)
    conv.answered(t0, 8)
    t1 = conv.prompt(f.make(2), 1, 0)
    assert t1.prompt.text.startswith(t0.prompt.text)  # the previous prompt is the next one's prefix
    # the new text's tokens, plus a token a word (uncalibrated) for the previous prompt and its 8-word answer
    assert t1.prompt.tokens == f.make(2).tokens + len(t0.prompt.text.split()) + 8
    assert [m["role"] for m in t1.messages] == ["user", "assistant", "user"]


class _Res:
    def __init__(self, ok: bool, end: int) -> None:
        self.error = None if ok else "http_5xx"
        self.end_ns = end
        self.usage = {"completion_tokens": 4} if ok else {}
        self.tok = [1, 1, 1, 1] if ok else []


def test_run_task_retries_thinks_and_abandons() -> None:
    """Turn 1 fails once then answers; with think time the next turn is due an answer's end + think later;
    with no retries left a failing turn abandons the task."""
    f = PromptFactory(16, seed=0)
    sent: list[tuple[int, int, int | None]] = []
    answers = iter([True, False, True, True])
    clock = [1000]

    async def send(warm: bool, due: int | None, turn: Turn) -> _Res:
        sent.append((turn.turn, turn.attempt, due))
        clock[0] += 100
        return _Res(next(answers), clock[0])

    t0 = time.monotonic_ns()

    def now() -> int:  # the fake clock, moving on with real time (the think time is slept for real)
        return clock[0] + time.monotonic_ns() - t0

    plan = TaskPlan(turns=3, think_time_s=0.001, retries=1)
    end = asyncio.run(run_task(plan, Conversation(f, "s", 3, 0), False, None, send, lambda: f.make(9),
                               lambda: False, now))
    assert [(t, a) for t, a, _ in sent] == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert sent[1][2] == 1100 + 1_000_000  # the next turn is due think time after the answer
    assert sent[2][2] == 1200  # a retry is due when the failed attempt ended
    assert end == 1400
    sent.clear()
    answers = iter([True, False])
    end = asyncio.run(run_task(TaskPlan(3, 0.0, 0), Conversation(f, "t", 3, 0), False, None, send,
                               lambda: f.make(9), lambda: False, now))
    assert [(t, a) for t, a, _ in sent] == [(0, 0), (1, 0)] and end == clock[0]


def test_task_options_are_checked_before_connecting() -> None:
    r = CliRunner()
    for args, why in ((["--turns", "0"], "--turns 0"), (["--think-time", "1s"], "give --turns N"),
                      (["--turns", "3", "--rate", "2"], "closed loop of tasks"),
                      (["--turns", "3", "--retries", "-1"], "--retries -1")):
        out = r.invoke(cli, ["attach", "--url", "http://127.0.0.1:9", "-d", "1s", *args])
        assert out.exit_code == exits.USAGE and why in out.output and "Traceback" not in out.output, out.output


def test_tasks_against_the_truth_server(tmp_path: Path) -> None:
    """attach --turns 3 --think-time 20ms --retries 1 at c=2: every measured request is a task's turn, the
    prompts grow turn by turn, the report has the task row."""
    from tests.servers.truth import truth_server

    with truth_server(ttft_ms=5, itl_ms=2) as (url, _):
        p = subprocess.run([sys.executable, "-m", "diagnose", "attach", "--url", url, "-c", "2", "-d", "3s",
                            "--output-tokens", "8", "--input-tokens", "32", "--baseline", "2", "--no-nvml",
                            "--turns", "3", "--think-time", "20ms", "--retries", "1", "--warmup", "1",
                            "-o", str(tmp_path / "b"), "--report", str(tmp_path / "r.html")],
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    recs = [r for r in open_bundle(tmp_path / "b").iter_records("requests") if r.get("phase") == 1]
    assert recs and all(r.get("turns") == 3 and r.get("session") for r in recs)
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_task.setdefault(str(r["session"]), []).append(r)
    grown = [sorted(v, key=lambda r: r["turn"]) for v in by_task.values() if len(v) == 3]
    assert grown and all(t[0]["prompt_tokens"] < t[1]["prompt_tokens"] < t[2]["prompt_tokens"] for t in grown)
    # the next turn waits for the answer plus the think time
    gaps = [(t[1]["sent_ns"] - t[0]["end_ns"]) / 1e6 for t in grown]
    assert all(g >= 20 for g in gaps), gaps
    a = analyze(tmp_path / "b")
    assert a.signals["tasks_completed"].value >= 3
    lat = a.signals["task_latency_p50_ms"].value
    assert lat >= 2 * 20  # two think times at least
    html = (tmp_path / "r.html").read_text()
    assert "task latency" in html and "tasks per second" in html


def test_a_task_is_cut_at_the_end_of_its_phase() -> None:
    """No turn of a task starts once the phase is over (its earlier turns stay; the task counts as cut)."""
    f = PromptFactory(16, seed=0)
    sent: list[int] = []

    async def send(warm: bool, due: int | None, turn: Turn) -> _Res:
        sent.append(turn.turn)
        return _Res(True, 10)

    over = iter([False, True])
    end = asyncio.run(run_task(TaskPlan(4, 0.0, 0), Conversation(f, "c", 4, 0), False, None, send,
                               lambda: f.make(3), lambda: next(over, True), lambda: 10))
    assert sent == [0, 1] and end is None



def test_task_goodput_judges_an_itl_term_as_the_request_goodput_does(tmp_path: Path) -> None:
    """An ITL P99 term: each answer's own chunk-gap P99, as for requests. Task a's turns stream with 2 ms gaps,
    b's last turn with a 30 ms gap: with itl_p99 at 10 ms only a is within the SLO."""
    chunks = [{"rid": f"{s}-{t}-{at}", "t": [sent + 5, sent + 7, sent + (35 if (s, t) == ("b", 2) else 9)],
               "tok": [1, 1, 1]}
              for s, t, at, sent in (("a", 0, 0, 0), ("a", 1, 0, 40), ("a", 2, 0, 80), ("b", 0, 0, 0),
                                     ("b", 1, 1, 55), ("b", 2, 0, 110))]
    t, _ = make_bundle(tmp_path, TASKS, chunks, slo={"itl_p99_ms": 10.0})
    s = {x.name: x.value for x in tasks.signals(t, WHOLE)}
    assert s["task_goodput_ratio"] == pytest.approx(1 / 4)
