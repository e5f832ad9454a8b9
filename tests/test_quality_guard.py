"""The quality guard (docs/compare.md, "Quality"): greedy captures keep output hashes (never text), compare and
verify report how many outputs of two runs agree and where they first part; --quality-cmd scores both runs; a
change that alters the outputs or lowers the score is "refuted: quality", one that breaks the SLO is never
"confirmed"."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

from diagnose import compare as cmp
from diagnose.cli import exits
from diagnose.cli.main import cli
from diagnose.compare import quality as q
from diagnose.errors import InputError
from diagnose.io.bundle import open_bundle
from diagnose.pipeline import analyze
from diagnose.probes.load_options import workload_from_options
from diagnose.probes.output_hash import STEP, output_hashes
from tests.load_testserver import TestServer
from tests.test_compare import QUEUE, _admitting, _rewrite, _rows, _write_rows


class OutputServer(TestServer):
    """Streams an output that is a function of the prompt (and, at a temperature above 0, of the sampling
    seed); ``perturb``: every n-th prompt (by its hash) gets different tokens from token ``at`` on."""

    __test__ = False

    def __init__(self, perturb: int = 0, at: int = 20, ids: str = "ignore", same_text: bool = False) -> None:
        super().__init__()
        self.perturb = perturb
        self.at = at
        # ``return_token_ids`` asked: "stream" them (vLLM), "ignore" the option (llama.cpp), "reject" it (400)
        self.ids = ids
        self.same_text = same_text  # a perturbed token that decodes to the same text (ids differ, text not)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if body.get("return_token_ids") and self.ids == "reject":
            return web.json_response({"error": {"message": "Unrecognized request argument supplied: "
                                                           "return_token_ids"}}, status=400)
        ids = bool(body.get("return_token_ids")) and self.ids == "stream"
        key = int(hashlib.sha256(str(body.get("prompt")).encode()).hexdigest()[:8], 16)
        if float(body.get("temperature") or 0) > 0:
            key ^= int(body.get("seed") or 0) * 7919
        bad = self.perturb and key % self.perturb == 0
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body.get("max_tokens") or 16)
        for i in range(n):
            shift = 1000 if bad and i >= self.at else 0
            word = f" zq{(key + i * 31 + (0 if self.same_text else shift)) % 997}"
            chunk = self._chunk(False, word, "length" if i == n - 1 else None, i + 1, False)
            if ids:  # the delta's token id in the choice, as vLLM streams it with return_token_ids
                obj = json.loads(chunk[6:])
                obj["choices"][0]["token_ids"] = [(key + i * 31 + shift) % 50_000]
                chunk = b"data: " + json.dumps(obj).encode() + b"\n\n"
            await resp.write(chunk)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _options(**kw: Any) -> dict[str, Any]:
    from diagnose.cli.attach import attach

    return {**attach.make_context("attach", ["--url", "http://127.0.0.1:9"]).params, **kw}


def capture(tmp_path: Path, name: str, srv: TestServer, **kw: Any) -> Path:
    from tests.test_workload import run_with_manifest

    o = _options(**{"baseline": 0, "warmup": 0, "concurrency": "2", "num_requests": 24, "output_tokens": "40",
                    "greedy": True, **kw})
    asyncio.run(run_with_manifest(srv, workload_from_options(o), tmp_path / name))
    return tmp_path / name


# -- what the client keeps ----------------------------------------------------------------------------------
def test_prefix_hashes_every_step_tokens_and_the_whole_text() -> None:
    h = output_hashes([" a"] * 20, [1] * 20)
    assert [t for t, _ in h["output_prefix_hashes"]] == [8, 16]
    assert h["output_hash"] == hashlib.blake2b(b" a" * 20, digest_size=8).hexdigest()
    # a chunk of several tokens is hashed where it ends: 6 + 6 passes 8 at 12
    h2 = output_hashes(["x" * 6, "y" * 6, "z"], [6, 6, 1])
    assert [t for t, _ in h2["output_prefix_hashes"]] == [12]
    # the same text in other chunks: the same whole hash
    assert output_hashes(["ab", "c"], [1, 1])["output_hash"] == output_hashes(["a", "bc"], [1, 1])["output_hash"]


def test_token_ids_hashed_at_exact_steps_and_text_hashed_without_them() -> None:
    h = output_hashes([" a"] * 20, [1] * 20, list(range(20)))
    assert h["output_hash_of"] == "token_ids" and [t for t, _ in h["output_prefix_hashes"]] == [8, 16]
    ids_bytes = b"".join(i.to_bytes(8, "little", signed=True) for i in range(20))
    assert h["output_hash"] == hashlib.blake2b(ids_bytes, digest_size=8).hexdigest()
    # the same ids in other chunks (several ids in one chunk): the same hashes, prefixes at exact multiples
    assert output_hashes(["x", "y"], [12, 8], list(range(20))) == h
    # a prefix hash is of the ids up to it: two outputs parting at id 12 agree at 8, not at 16
    other = output_hashes([" a"] * 20, [1] * 20, [*range(12), *range(100, 108)])
    assert other["output_prefix_hashes"][0] == h["output_prefix_hashes"][0]
    assert other["output_prefix_hashes"][1] != h["output_prefix_hashes"][1]
    # no ids streamed: the text, as before
    assert output_hashes([" a"] * 20, [1] * 20, None)["output_hash_of"] == "text"
    assert output_hashes([" a"] * 20, [1] * 20, [])["output_hash_of"] == "text"


def test_greedy_asks_for_token_ids_and_hashes_them_where_the_server_streams_them(tmp_path: Path) -> None:
    """vLLM streams each delta's token ids when asked (return_token_ids): the hashes are of the ids, so two
    outputs whose tokens differ but decode to the same text are told apart; a server that ignores the option
    (llama.cpp) is hashed by text, and one that rejects it (400) is asked again without it."""
    srv = OutputServer(ids="stream")
    a = capture(tmp_path, "a", srv)
    assert all(x.get("return_token_ids") is True for x in srv.bodies)
    assert '"return_token_ids": true' in (a / "manifest.json").read_text().replace('":true', '": true')
    recs = list(open_bundle(a).iter_records("requests"))
    assert recs and all(r["output_hash_of"] == "token_ids" and len(r["output_prefix_hashes"]) == 40 // STEP
                        for r in recs)
    assert b"zq" not in b"".join(p.read_bytes() for p in a.iterdir() if p.is_file())
    b = capture(tmp_path, "b", OutputServer(ids="stream", perturb=2, at=20, same_text=True))
    ag = q.agreement(str(a), str(b))
    assert ag is not None and ag["hashed"] == "token ids" and 0 < ag["identical"] < 24, ag
    assert ag["agreed_tokens_min"] == 16  # the ids part at token 21; the text never does
    assert q.agreement(str(capture(tmp_path, "at", OutputServer(same_text=True))),
                       str(capture(tmp_path, "bt", OutputServer(perturb=2, at=20, same_text=True))))["identical"] == 24
    rej = OutputServer(ids="reject")
    c = capture(tmp_path, "c", rej)
    statuses = [x.get("return_token_ids") for x in rej.bodies]
    assert statuses[0] is True and statuses[-1] is None  # asked, refused, asked again without it
    recs_c = list(open_bundle(c).iter_records("requests"))
    assert recs_c and all(r["output_hash_of"] == "text" for r in recs_c)
    # a run hashed by ids beside one hashed by text: nothing is compared, and it says why
    mixed = q.agreement(str(a), str(c))
    assert mixed is not None and mixed["pairs"] == 0 and mixed["kind_mismatched"] == 24
    assert "one run hashed the outputs' token ids and the other their text" in mixed["note"]
    assert q.judge({"agreement": mixed}) == ([], [])


def test_greedy_sends_temperature_0_and_the_seed_and_keeps_hashes_not_text(tmp_path: Path) -> None:
    srv = OutputServer()
    b = capture(tmp_path, "a", srv, seed=5)
    sent = [x for x in srv.bodies if x.get("max_tokens") == 40]
    assert sent and all(x["temperature"] == 0.0 and x["seed"] == 5 for x in sent)
    m = orjson.loads((b / "manifest.json").read_bytes())
    assert m["workload"]["extra"]["sampling"] == {"temperature": 0.0, "seed": 5, "greedy": True}
    recs = list(open_bundle(b).iter_records("requests"))
    assert recs and all(isinstance(r["output_hash"], str) and len(r["output_prefix_hashes"]) == 40 // STEP for r in recs)
    raw = b"".join(p.read_bytes() for p in b.iterdir() if p.is_file())
    assert b"output_text" not in raw and b"zq" not in raw  # no text without --store-text


def test_sampling_options_checked() -> None:
    from diagnose.probes.load_options import sampling_from_options

    assert sampling_from_options(_options()) == {}
    t = sampling_from_options(_options(temperature=0.8, sampling_seed=3))
    assert t["sampling"] == {"temperature": 0.8, "seed": 3, "greedy": False} and t["output_hash"]
    for kw, why in (({"greedy": True, "temperature": 0.5}, "drop --temperature"),
                    ({"sampling_seed": 3}, "give --greedy or --temperature"),
                    ({"temperature": -1.0}, "must be 0 to 100"), ({"temperature": float("nan")}, "must be 0 to 100")):
        with pytest.raises(InputError, match=why):
            workload_from_options(_options(**kw))


# -- agreement between two captures -------------------------------------------------------------------------
def test_two_greedy_captures_agree_and_a_perturbed_one_does_not(tmp_path: Path) -> None:
    a = capture(tmp_path, "a", OutputServer())
    b = capture(tmp_path, "b", OutputServer())
    ag = q.agreement(str(a), str(b))
    assert ag is not None and ag["pairs"] == 24 and ag["identical"] == 24 and ag["greedy"]
    assert q.judge({"agreement": ag}) == ([], [])
    c = capture(tmp_path, "c", OutputServer(perturb=2, at=20))
    ag2 = q.agreement(str(a), str(c))
    assert ag2 is not None and 0 < ag2["identical"] < 24
    # the perturbed outputs part at token 21 (index 20): their prefixes agree up to the checkpoint at 16
    assert ag2["agreed_tokens_min"] == 16 and ag2["agreed_tokens_p50"] == 16.0
    failed, _ = q.judge({"agreement": ag2})
    assert failed and "greedy outputs identical" in failed[0] and "first 16 tokens" in failed[0]


def test_sampled_runs_with_other_seeds_differ_and_are_not_judged(tmp_path: Path) -> None:
    a = capture(tmp_path, "a", OutputServer(), greedy=False, temperature=0.8, sampling_seed=1)
    b = capture(tmp_path, "b", OutputServer(), greedy=False, temperature=0.8, sampling_seed=2)
    ag = q.agreement(str(a), str(b))
    assert ag is not None and ag["pairs"] == 24 and ag["identical"] < 24 and not ag["greedy"]
    assert "not judged" in ag["note"] and q.judge({"agreement": ag}) == ([], [])


def test_compare_cli_reports_agreement(tmp_path: Path) -> None:
    a = capture(tmp_path, "a", OutputServer())
    c = capture(tmp_path, "c", OutputServer(perturb=2, at=20))
    r = CliRunner().invoke(cli, ["compare", str(a), str(c), "--resamples", "200", "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    assert "outputs identical for the same prompt" in r.output and "quality check failed" in r.output
    js = json.loads((tmp_path / "c.json").read_text())
    assert js["quality"]["agreement"]["pairs"] == 24 and js["quality"]["failed"]
    g = CliRunner().invoke(cli, ["compare", str(a), str(c), "--resamples", "200", "--fail-on-regression",
                                 "ttft_p99=1000%", "--allow-undecided"])
    assert g.exit_code == exits.REGRESSION, g.output


# -- the quality command ------------------------------------------------------------------------------------
def test_quality_cmd_score_from_the_last_line_bounded_and_failing_cleanly(tmp_path: Path) -> None:
    assert q.run_score("echo warming; echo 'accuracy: 0.82'", "x") == {"score": 0.82}
    assert q.run_score(f"{sys.executable} -c \"import os; print(len(os.environ['DIAGNOSE_BUNDLE']))\"",
                       "abcd") == {"score": 4.0}
    assert q.run_score("echo {bundle}", "/tmp/7 x") == {"score": 7.0}  # quoted: one argument
    assert "ran past 0.5 s" in q.run_score("sleep 5", "x", timeout_s=0.5)["error"]
    assert "exited with status 3: bad" in q.run_score("echo bad >&2; exit 3", "x")["error"]
    assert "printed no score" in q.run_score("echo done", "x")["error"]
    with pytest.raises(InputError, match="--min-agreement"):
        q.check_options(1.5, 0.02, 10)


def _with_outputs(dst: Path, differ_every: int = 0) -> Path:
    """``dst`` (a copy of the queue-bound sample) with the output hashes a greedy capture keeps: one output per
    prompt, every ``differ_every``-th of them different (0: none)."""
    rows = _rows(dst / "requests.jsonl.gz")
    for r in rows:
        seq = int(str(r["rid"]).rsplit("-", 1)[1])
        r["prompt_hash"] = f"p{seq}"
        bad = differ_every and seq % differ_every == 0
        r["output_hash"] = f"o{seq}" + ("x" if bad else "")
        r["output_prefix_hashes"] = [[8, f"a{seq}"], [16, f"b{seq}" + ("x" if bad else "")]]
    _write_rows(dst / "requests.jsonl.gz", rows)
    m = orjson.loads((dst / "manifest.json").read_bytes())
    m["workload"]["extra"] = {"sampling": {"temperature": 0.0, "seed": 0, "greedy": True}, "output_hash": True}
    (dst / "manifest.json").write_bytes(orjson.dumps(m))
    return dst


def test_verify_refutes_a_gain_that_changes_the_outputs(tmp_path: Path) -> None:
    before = _with_outputs(_rewrite(QUEUE, tmp_path / "before"))
    same = _with_outputs(_admitting(_rewrite(QUEUE, tmp_path / "same", ttft_scale=0.3)))
    v = cmp.verify(analyze(before), analyze(same), resamples=300)
    assert v.outcome == "confirmed" and not v.refuted_by and v.comparison.quality is not None
    assert v.comparison.quality["agreement"]["share"] == 1.0
    changed = _with_outputs(_admitting(_rewrite(QUEUE, tmp_path / "changed", ttft_scale=0.3)), differ_every=2)
    v2 = cmp.verify(analyze(before), analyze(changed), resamples=300)
    assert v2.outcome == "refuted" and v2.refuted_by == "quality"
    assert v2.headline().startswith("refuted: quality: SCH001") and "by the latencies alone: confirmed" in v2.reason
    r = CliRunner().invoke(cli, ["verify", str(before), str(changed), "--resamples", "300"])
    assert r.exit_code == exits.REFUTED and r.output.startswith("refuted: quality:"), r.output


def test_verify_refutes_on_a_score_drop_and_is_inconclusive_without_a_score(tmp_path: Path) -> None:
    before = _rewrite(QUEUE, tmp_path / "before")
    after = _admitting(_rewrite(QUEUE, tmp_path / "after", ttft_scale=0.3))
    cmd = "case {bundle} in *after) echo 0.70;; *) echo 0.90;; esac"
    v = cmp.verify(analyze(before), analyze(after), resamples=300, quality_cmd=cmd)
    assert v.outcome == "refuted" and v.refuted_by == "quality" and "0.9 -> 0.7 (-22.2%" in v.reason
    ok = cmp.verify(analyze(before), analyze(after), resamples=300, quality_cmd="echo 0.9")
    assert ok.outcome == "confirmed" and ok.comparison.quality["score"]["rel"] == 0.0  # type: ignore[index]
    broken = cmp.verify(analyze(before), analyze(after), resamples=300, quality_cmd="exit 1")
    assert broken.outcome == "inconclusive" and "quality not measured" in broken.reason
