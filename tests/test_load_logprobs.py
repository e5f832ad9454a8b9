"""attach --logprobs N (issue 34, rule SCH014): every request asks for its tokens' log-probabilities with N
alternatives each, the manifest records N (workload.extra.logprobs), the analysis reads it as the signal
workload_logprobs_tokens, and the client's token count is not fooled by the log-probability payloads (token
strings that look like the markers its fast path looks for)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from diagnose.errors import InputError
from diagnose.io.bundle import open_bundle
from diagnose.probes.load_options import workload_from_options
from tests.load_testserver import TestServer

# alternatives that hold the markers of the client's fast path (probes/sse.py) and SSE framing
NASTY = ('"text":"', "text", "content", '"content":"', "data: ", "[DONE]", "\n\n", '"finish_reason":"stop"',
         '"completion_tokens":9', " tok")


class LogprobsServer(TestServer):
    """Streams like vLLM with logprobs asked: each content chunk carries the token's log-probability and its
    top alternatives (completions: the legacy lists and dicts; chat: ``logprobs.content``)."""

    __test__ = False

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        chat = request.path.endswith("/chat/completions")
        so = body.get("stream_options") or {}
        top = int(body.get("top_logprobs") or 0) if chat else int(body.get("logprobs") or 0)
        asked = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body.get("max_tokens") or 16)
        if chat:
            await resp.write(self._chunk(True, "", None, 0, False, role=True))
        for i in range(n):
            alts = [NASTY[(i + j) % len(NASTY)] for j in range(top)]
            fin = "length" if i == n - 1 else None
            if chat:
                lp = {"content": [{"token": " tok", "logprob": -0.5, "bytes": [32, 116, 111, 107],
                                   "top_logprobs": [{"token": a, "logprob": -1.0 - j, "bytes": list(a.encode())}
                                                    for j, a in enumerate(alts)]}]} if asked else None
                choice: dict[str, Any] = {"index": 0, "delta": {"content": " tok"}, "logprobs": lp,
                                          "finish_reason": fin}
            else:
                lp = {"text_offset": [4 * i], "token_logprobs": [-0.5], "tokens": [" tok"],
                      "top_logprobs": [{a: -1.0 - j for j, a in enumerate(alts)}]} if asked else None
                choice = {"index": 0, "text": " tok", "logprobs": lp, "finish_reason": fin, "stop_reason": None}
            obj: dict[str, Any] = {"id": "cmpl-1", "object": "chunk", "model": "tiny", "choices": [choice]}
            if so.get("continuous_usage_stats"):
                obj["usage"] = {"prompt_tokens": 7, "completion_tokens": i + 1, "total_tokens": i + 8}
            await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _options(**kw: Any) -> dict[str, Any]:
    from diagnose.cli.attach import attach

    return {**attach.make_context("attach", ["--url", "http://127.0.0.1:9"]).params, **kw}


def _capture(tmp_path: Path, api: str, logprobs: int | None) -> tuple[Path, LogprobsServer]:
    from tests.test_workload import run_with_manifest

    srv = LogprobsServer()
    o = _options(baseline=0, warmup=0, concurrency="2", num_requests=12, output_tokens="24", api=api,
                 logprobs=logprobs)
    out = tmp_path / f"{api}-{logprobs}"
    asyncio.run(run_with_manifest(srv, workload_from_options(o), out))
    return out, srv


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_logprobs_asked_recorded_and_every_token_counted_once(tmp_path: Path, api: str) -> None:
    from diagnose.cli.analyze import analysis_json, run_analysis

    b, srv = _capture(tmp_path, api, 8)
    sent = [x for x in srv.bodies if x.get("max_tokens") == 24]
    assert len(sent) == 12
    if api == "chat":
        assert all(x["logprobs"] is True and x["top_logprobs"] == 8 for x in sent)
    else:
        assert all(x["logprobs"] == 8 and "top_logprobs" not in x for x in sent)
    m = json.loads((b / "manifest.json").read_text())
    assert m["workload"]["extra"]["logprobs"] == 8
    bundle = open_bundle(b)
    assert bundle.meta.workload is not None and bundle.meta.workload.logprobs == 8
    recs = [r for r in bundle.iter_records("requests") if not r.get("warmup")]
    assert len(recs) == 12 and all(r["ok"] and r["output_tokens_chunks"] == 24 for r in recs)
    js = analysis_json(run_analysis(b))
    assert js["signals"]["workload_logprobs_tokens"]["value"] == 8.0
    assert js["signals"]["workload_logprobs_tokens"]["unit"] == "tokens"
    assert js["signals"]["output_tokens_mean"]["value"] == 24.0


def test_without_the_option_nothing_is_asked_or_recorded(tmp_path: Path) -> None:
    from diagnose.cli.analyze import analysis_json, run_analysis

    b, srv = _capture(tmp_path, "completions", None)
    assert srv.bodies and all("logprobs" not in x and "top_logprobs" not in x for x in srv.bodies)
    m = json.loads((b / "manifest.json").read_text())
    assert "logprobs" not in m["workload"].get("extra", {})
    assert open_bundle(b).meta.workload.logprobs is None  # type: ignore[union-attr]
    plain = analysis_json(run_analysis(b))["signals"]
    assert "workload_logprobs_tokens" not in plain
    # the bytes the server wrote for each token: a plain chunk (~220 bytes of JSON and framing here) against one
    # carrying 8 alternatives (twice that here)
    per_token = plain["stream_bytes_per_token_mean"]["value"]
    assert plain["stream_bytes_per_token_mean"]["unit"] == "bytes" and 100 < per_token < 300
    b8, _ = _capture(tmp_path, "completions", 8)
    assert analysis_json(run_analysis(b8))["signals"]["stream_bytes_per_token_mean"]["value"] > 1.5 * per_token


def test_logprobs_zero_asks_for_the_sampled_tokens_own() -> None:
    spec = workload_from_options(_options(logprobs=0, concurrency="1"))
    assert spec.extra == {"logprobs": 0}


@pytest.mark.parametrize("bad", [-1, 100_001])
def test_logprobs_out_of_range_is_one_line_error(bad: int) -> None:
    with pytest.raises(InputError, match=rf"--logprobs {bad}: must be 0 to 100000"):
        workload_from_options(_options(logprobs=bad, concurrency="1"))



def test_compare_counts_a_logprobs_difference_as_a_changed_variable(tmp_path: Path) -> None:
    from diagnose import compare as cmp
    from diagnose.pipeline import analyze
    from tests.test_compare import QUEUE, _rewrite

    b = _rewrite(QUEUE, tmp_path / "b", manifest={"workload": {"extra": {"logprobs": 20}}})
    c = cmp.compare(analyze(QUEUE), analyze(b), resamples=100)
    assert c.comparability["changed"] == [{"what": "workload.logprobs", "a": None, "b": 20}]
    assert c.comparability["attribution"].startswith("one variable changed (workload.logprobs)")
