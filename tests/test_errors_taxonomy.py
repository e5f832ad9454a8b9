"""Failed requests named by their class (diagnose/normalize/errors.py, issue 34): the engines' real error bodies
pinned, the signals on a bundle, the rules' verdict, and a server killed mid-run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from diagnose.normalize import errors
from diagnose.pipeline import analyze
from tests.load_testserver import TestServer
from tests.test_client_metrics import make_bundle, req, sigs
from tests.test_load_probe import run_probe, spec_for

# The bodies as the engines write them (the load client keeps "HTTP <status>: <body>")
LLAMA_OVERFLOW = ('HTTP 400: {"error":{"code":400,"message":"request (1034 tokens) exceeds the available context '
                  'size (256 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":1034,'
                  '"n_ctx":256}}')  # llama.cpp tools/server (the build in ~/.cache/diagnose has this format string)
LLAMA_OVERFLOW_OLD = ('HTTP 400: {"error":{"code":400,"message":"the request exceeds the available context size, '
                      'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":600,"n_ctx":512}}')
VLLM_REQUESTED = ('HTTP 400: {"object":"error","message":"This model\'s maximum context length is 2048 tokens. However, '
                  'you requested 2148 tokens (2048 in the messages, 100 in the completion). Please reduce the length '
                  'of the messages or completion.","type":"BadRequestError","param":null,"code":400}')
VLLM_TOO_LARGE = ('HTTP 400: {"error":{"message":"\'max_tokens\' or \'max_completion_tokens\' is too large: 100. This '
                  'model\'s maximum context length is 2048 tokens and your request has 2000 input tokens '
                  '(100 > 2048 - 2000).","type":"BadRequestError","param":null,"code":400}}')
VLLM_PROMPT = ('HTTP 400: {"error":{"message":"This model\'s maximum context length is 2048 tokens. However, your '
               'prompt contains 3000 input tokens, which exceeds this limit even without any output tokens. Please '
               'reduce the length of the input prompt. (parameter=input_tokens, value=3000)","type":"BadRequestError",'
               '"param":"input_tokens","code":400}}')  # vllm/renderers/params.py (the vLLM CPU build here)
VLLM_DECODER = ('HTTP 400: {"error":{"message":"The decoder prompt (length 3000) is longer than the maximum model '
                'length of 2048. Make sure that `max_model_len` is no smaller than the number of text tokens.",'
                '"type":"BadRequestError","code":400}}')  # vllm/v1/engine/input_processor.py
SGLANG = ('HTTP 400: {"object":"error","message":"The input (3000 tokens) is longer than the model\'s context length '
          '(2048 tokens).","type":"BadRequestError","code":400}')
TGI = ('HTTP 422: {"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. Given: 2000 '
       '`inputs` tokens and 100 `max_new_tokens`","error_type":"validation"}')


@pytest.mark.parametrize("body, status, limit, need", [
    (LLAMA_OVERFLOW, 400, 256, 1034 + 64),  # llama.cpp counts the prompt: the request's max_tokens (64) is added
    (LLAMA_OVERFLOW_OLD, 400, 512, 600 + 64),
    (VLLM_REQUESTED, 400, 2048, 2148),
    (VLLM_TOO_LARGE, 400, 2048, 2100),
    (VLLM_PROMPT, 400, 2048, 3000 + 64),
    (VLLM_DECODER, 400, 2048, 3000 + 64),
    (SGLANG, 400, 2048, 3000 + 64),
    (TGI, 422, 2048, 2100),
])
def test_the_engines_context_overflow_bodies_give_the_class_and_the_sizes(body: str, status: int, limit: float,
                                                                         need: float) -> None:
    assert errors.classify("http_4xx", status, body) == "context_overflow"
    assert errors.context_sizes(body, 64.0) == (limit, need)


@pytest.mark.parametrize("error, status, body, cls", [
    ("http_429", 429, 'HTTP 429: {"error":"rate limit exceeded"}', "rate_limited"),
    ("http_4xx", 401, 'HTTP 401: {"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}',
     "auth"),
    ("http_4xx", 403, "HTTP 403: forbidden", "auth"),
    ("http_4xx", 404, 'HTTP 404: {"object":"error","message":"The model `llama` does not exist.","code":404}',
     "model_not_found"),
    ("http_4xx", 400, 'HTTP 400: {"error":{"code":400,"message":"model \'x\' not found"}}', "model_not_found"),
    ("http_4xx", 400, 'HTTP 400: {"object":"error","message":"unknown field ignore_eos"}', "invalid_request"),
    ("http_4xx", 408, "HTTP 408: request timeout", "server_timeout"),
    ("http_5xx", 504, "HTTP 504: Gateway Time-out", "server_timeout"),
    ("http_5xx", 500, "HTTP 500: Internal Server Error", "server_error"),
    ("http_5xx", 503, "HTTP 503: Service Unavailable", "server_error"),
    ("reset", None, "connection closed mid-response (EOF)", "connection_lost"),
    ("refused", None, "connection refused by 127.0.0.1:8000", "connection_lost"),
    ("connect", None, "connect to 10.0.0.1:8000 timed out", "connection_lost"),
    ("timeout", 200, "no answer in 30 s", "client_timeout"),
    ("malformed_sse", 200, "stream ended without data: [DONE] or a finish_reason", "stream_broken"),
    (None, 200, None, None),
    ("incomplete", 200, "capture stopped", None),
])
def test_every_failure_gets_its_class(error: str | None, status: int | None, body: str | None, cls: str | None) -> None:
    assert errors.classify(error, status, body) == cls


def test_a_quoted_body_is_redacted_and_shortened() -> None:
    body = ("HTTP 401: bad key Bearer abcdef123456 for http://alice:s3cret@gw.example/v1 api_key=sk-live-12345678 "
            + "x" * 400)
    q = errors.quote(body)
    assert len(q) <= errors.QUOTE_CHARS
    for secret in ("abcdef123456", "s3cret", "alice", "sk-live-12345678"):
        assert secret not in q
    assert q.startswith("HTTP 401: bad key Bearer [redacted]")


PHASE = [{"phase": 0, "name": "c=4", "concurrency": 4, "start": 0, "end": 1000}]


def _failed(rid: str, sent: float, body: str, status: int = 400, error: str = "http_4xx",
            **kw: Any) -> dict[str, Any]:
    r = req(rid, sent, sent + 3, ok=False, error=error, status=status, n=64)
    r["error_detail"] = body
    r.update(kw)
    return r


def test_every_request_overflowing_gives_the_class_and_the_sizes(tmp_path: Path) -> None:
    reqs = [_failed(f"r{i}", i * 10, LLAMA_OVERFLOW) for i in range(8)]
    tables, _ = make_bundle(tmp_path, reqs, [], phases=PHASE)
    s = sigs(tables)
    assert s["error_rate_ratio"] == 1.0 and s["error_context_overflow_ratio"] == 1.0
    assert s["error_auth_ratio"] == 0.0 and s["error_context_overflow_requests"] == 8
    assert s["error_context_limit_tokens"] == 256 and s["error_context_request_tokens"] == 1034 + 64
    assert s["error_main_share_ratio"] == 1.0


def test_a_clean_run_gains_no_error_signal(tmp_path: Path) -> None:
    tables, _ = make_bundle(tmp_path, [req(f"r{i}", i * 10, i * 10 + 5, first=i * 10 + 1, n=3) for i in range(5)], [])
    assert not [k for k in sigs(tables) if k.startswith("error_") and k != "error_rate_ratio"]


def test_the_verdict_names_the_context_overflow_with_the_sizes_and_quotes_the_body(tmp_path: Path) -> None:
    reqs = [_failed(f"r{i}", i * 10, LLAMA_OVERFLOW) for i in range(8)]
    make_bundle(tmp_path, reqs, [], phases=PHASE)
    a = analyze(tmp_path / "b")
    v = a.verdict
    assert v.level == "invalid" and "does not fit the server's context" in v.headline, v.headline
    assert "needs 1,098 tokens, the context holds 256" in v.headline, v.headline
    by_id = {f.rule_id: f for f in a.findings}
    err = by_id["ERR001"]
    assert "exceeds the available context size (256 tokens)" in err.hypothesis  # the body, quoted
    assert err.causes[0].status == "supported" and err.causes[0].cause.startswith("the server's context")
    val7 = by_id["VAL007"]
    assert val7.causes[0].cause.startswith("the requests do not fit") and val7.causes[0].status == "supported"


def test_a_rate_limit_before_the_engine_gives_its_retry_after(tmp_path: Path) -> None:
    reqs = [req(f"ok{i}", i * 10, i * 10 + 5, first=i * 10 + 1, n=3) for i in range(6)]
    reqs += [_failed(f"r{i}", 100 + i * 10, 'HTTP 429: {"error":"too many requests"}', status=429,
                     error="http_429", retry_after_s=2.5) for i in range(4)]
    tables, _ = make_bundle(tmp_path, reqs, [], phases=PHASE)
    s = sigs(tables)
    assert s["error_rate_limited_ratio"] == pytest.approx(0.4) and s["error_retry_after_s"] == 2.5


def test_a_critical_finding_ranks_above_the_error_level_ones(tmp_path: Path) -> None:
    """A server killed at 60 ms: 6 successes, then resets and refusals; ERR008 (critical) leads, VAL003 (error)
    is its consequence."""
    reqs = [req(f"ok{i}", i * 10, i * 10 + 5, first=i * 10 + 1, n=3) for i in range(6)]
    reqs += [_failed("reset", 55, "connection closed mid-response (EOF)", status=200, error="reset")]
    reqs += [_failed(f"lost{i}", 60 + i * 2, "connection refused by 127.0.0.1:8000", status=0, error="refused")
             for i in range(5)]
    tables, _ = make_bundle(tmp_path, reqs, [], phases=PHASE)
    s = sigs(tables)
    assert s["server_lost_at_s"] == pytest.approx(0.058) and "server_back_at_s" not in s
    assert s["error_connection_lost_requests"] == 6
    a = analyze(tmp_path / "b")
    ids = [f.rule_id for f in a.findings]
    assert ids[0] == "ERR008" and ids.index("ERR008") < ids.index("VAL003"), ids
    assert a.verdict.headline == "Run invalid: the server stopped answering at t = 0.1 s (6 requests lost)"
    assert next(f for f in a.findings if f.rule_id == "VAL003").explained_by == "ERR008"


def test_a_server_that_comes_back_is_a_restart(tmp_path: Path) -> None:
    reqs = [req(f"ok{i}", i * 10, i * 10 + 5, first=i * 10 + 1, n=3) for i in range(10)]
    reqs += [_failed(f"lost{i}", 100 + i, "connection refused", status=0, error="refused") for i in range(3)]
    reqs += [req(f"back{i}", 200 + i * 10, 205 + i * 10, first=201 + i * 10, n=3) for i in range(10)]
    tables, _ = make_bundle(tmp_path, reqs, [], phases=PHASE)
    s = sigs(tables)
    assert s["server_lost_at_s"] == pytest.approx(0.103) and s["server_back_at_s"] == pytest.approx(0.2)
    ids = [f.rule_id for f in analyze(tmp_path / "b").findings]
    assert "ERR009" in ids and "ERR008" not in ids


def test_a_server_killed_mid_run_is_named_with_when_and_how_many_were_lost(tmp_path: Path) -> None:
    """The load client against a real local server that is stopped once 16 requests came in (of a 6 s run): the
    in-flight requests are reset, every later one refused. The verdict says when it stopped and how many requests were lost, not
    which share failed."""
    server = TestServer(itl_s=0.02)
    killed: list[int] = []

    async def run() -> Any:
        url = await server.start()

        async def kill() -> None:  # once a dozen requests have come in (some finished), whatever the machine's load
            while len(server.bodies) < 16:
                await asyncio.sleep(0.01)
            killed.append(time.monotonic_ns())  # the load client's clock (probes/sse.py now_ns)
            await server.stop()

        killer = asyncio.ensure_future(kill())
        spec = spec_for("4", duration_s=6.0, num_requests=None, output_tokens=16)
        out = await run_probe(server, spec, tmp_path / "b", url=url)
        await asyncio.wait_for(killer, 10.0)  # never a hang: a run that ended before the kill fails here
        return out

    _status, b = asyncio.run(run())
    a = analyze(tmp_path / "b")
    s = {k: v.value for k, v in a.signals.items()}
    recs = b.records("requests")
    t0 = min(r["sent_ns"] for r in recs)
    ok_end = max(r["end_ns"] for r in recs if r["ok"])
    lost = [r for r in recs if r["error"] in ("reset", "refused", "connect")]
    assert s["error_connection_lost_requests"] == len(lost) >= 4, s
    # the first loss comes after the kill and the last success, and is the first lost request's end
    assert (killed[0] - t0) / 1e9 <= s["server_lost_at_s"], (s, killed[0] - t0)
    assert s["server_lost_at_s"] == pytest.approx((min(r["end_ns"] for r in lost) - t0) / 1e9, abs=1e-6)
    assert (ok_end - t0) / 1e9 <= s["server_lost_at_s"] + 0.1 and "server_back_at_s" not in s
    v = a.verdict
    assert v.level == "invalid" and v.headline.startswith("Run invalid: the server stopped answering at t = "), v.headline
    assert f"({s['error_connection_lost_requests']:.0f} requests lost)" in v.headline
    assert "failed" not in v.headline
