"""Issue 33, item 2: `diagnose attach --prometheus URL` against a hostile Prometheus query API.

The API here (an aiohttp server on 127.0.0.1, started by each test) replays the recorded two-replica fleet of
tests/data/fleet, asks for the Basic credentials the URL carries (401 otherwise), and misbehaves on demand:
errors that echo the credentials, HTML, garbage, slow or trickling answers, NaN / Inf / 1e308 values,
wrongly shaped entries and answers larger than the cap. Credentials must reach no stderr line, no file of the
bundle and no report; a bad answer is skipped and counted or a one-line error, never an internal error.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from diagnose.cli.main import cli
from diagnose.io.bundle import open_bundle
from tests.fleet_prom import FakePrometheus, load_recording, serve

USER, PASSWORD = "alice", "s3cr3t"
TOKEN = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
SECRETS = (PASSWORD, f"{USER}:{PASSWORD}", TOKEN)
SEL = '{job="vllm"}'

pytestmark = pytest.mark.timeout(120)  # only to catch a hang


class Hostile(FakePrometheus):
    """The recorded fleet behind Basic auth, or one misbehaviour for every call but the first ``spare``."""

    def __init__(self, mutate: Callable[[str, dict[str, Any]], None] | None = None, mode: str = "replay",
                 spare: int = 0) -> None:
        super().__init__(load_recording())
        self.mode, self.spare, self.n, self.mutate = mode, spare, 0, mutate
        self.authorized = 0

    async def replay(self, request: web.Request) -> web.StreamResponse:
        """The recorded answer, passed through ``mutate(query, data)`` (after the time shift)."""
        resp = await super().handle(request)
        if self.mutate is None or not isinstance(resp, web.Response) or resp.body is None:
            return resp
        payload = json.loads(resp.body)  # type: ignore[arg-type]
        if isinstance(payload.get("data"), dict) and payload["data"].get("resultType") in ("vector", "matrix"):
            self.mutate(request.query.get("query", ""), payload["data"])
        return web.json_response(payload, status=resp.status)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        echo = f"Authorization: {auth} ({USER}:{PASSWORD}) for {request.path_qs}"
        if auth != f"Basic {TOKEN}":
            return web.json_response({"status": "error", "errorType": "unauthorized", "error": f"denied: {echo}"},
                                     status=401)
        self.authorized += 1
        self.n += 1
        if self.n <= self.spare or self.mode == "replay":
            return await self.replay(request)
        if self.mode == "echo401":
            return web.json_response({"status": "error", "errorType": "unauthorized", "error": f"denied: {echo}"},
                                     status=401)
        if self.mode == "echo500":
            return web.Response(status=500, text=f"internal error; request was {echo}")
        if self.mode == "html":
            return web.Response(status=200, content_type="text/html",
                                text=f"<html><body>login page {echo} password={PASSWORD}</body></html>")
        if self.mode == "garbage":
            return web.Response(status=200, body=bytes(range(256)) * 3 + echo.encode(), content_type="text/plain")
        if self.mode == "slow":
            await asyncio.sleep(60)
            return web.Response(status=200, text="{}")
        if self.mode == "trickle":
            resp = web.StreamResponse(status=200)
            resp.content_type = "application/json"
            await resp.prepare(request)
            for _ in range(120):
                await resp.write(b" ")
                await asyncio.sleep(0.5)
            return resp
        if self.mode == "huge":  # a valid start, then 16 MiB of padding, streamed without a length
            resp = web.StreamResponse(status=200)
            resp.content_type = "application/json"
            await resp.prepare(request)
            await resp.write(b'{"status": "success", "data": {"resultType": "vector", "result": [' + b" " * 1024)
            for _ in range(16):
                await resp.write(b" " * (1 << 20))
            await resp.write(b"]}}")
            return resp
        if self.mode == "huge_length":  # a declared length over the cap
            return web.Response(status=200, body=b" " * (3 << 20), content_type="application/json")
        raise AssertionError(self.mode)


def _run(url: str, out: Path, *extra: str) -> Result:
    return CliRunner().invoke(cli, ["attach", "--prometheus", url, "--selector", SEL, "--since", "40s", "-o",
                                    str(out), *extra])


def _cred_url(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


def _no_secret_anywhere(r: Result, root: Path) -> None:
    text = r.output + r.stderr
    for s in SECRETS:
        assert s not in text, f"{s!r} on stdout/stderr: {text}"
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            if f.suffix == ".gz":
                import gzip

                data = gzip.decompress(data)
            for s in SECRETS:
                assert s.encode() not in data, f"{s!r} in {f}"


def _one_line(r: Result) -> str:
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("diagnose: error:") and "Traceback" not in r.stderr, r.stderr
    assert "diagnose: internal error" not in r.stderr, r.stderr
    return lines[-1]


@pytest.mark.parametrize("mode", ["echo401", "echo500", "html", "garbage", "slow", "trickle"])
def test_credentials_in_the_url_reach_no_error_line_or_file(mode: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnose.probes.prometheus_api as pa

    monkeypatch.setattr(pa, "TIMEOUT_S", 2.0, raising=False)  # the slow modes: a 2 s timeout, not 30 s
    fake = Hostile(mode=mode, spare=1)  # the reachability check passes, the first real query misbehaves
    with serve(fake) as url:
        r = _run(_cred_url(url), tmp_path / "b")
    assert fake.authorized >= 1  # the credentials were sent (as Basic auth)
    assert r.exit_code == 3, r.stderr
    line = _one_line(r)
    assert "/api/v1/" in line
    if mode in ("slow", "trickle"):
        assert "no answer within 2 s" in line
    _no_secret_anywhere(r, tmp_path)
    assert not (tmp_path / "b").exists()


def test_credentials_of_an_unreachable_prometheus_are_not_shown(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _run(f"http://{USER}:{PASSWORD}@127.0.0.1:{port}", tmp_path / "b")
    assert r.exit_code == 3 and "cannot reach Prometheus at http://127.0.0.1:" in _one_line(r)
    _no_secret_anywhere(r, tmp_path)


def test_credentials_are_used_but_never_stored_on_success(tmp_path: Path) -> None:
    fake = Hostile()
    with serve(fake) as url:
        r = _run(_cred_url(url), tmp_path / "b", "--report", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.stderr
    assert fake.authorized > 10 and not fake.unmatched
    _no_secret_anywhere(r, tmp_path)
    b = open_bundle(tmp_path / "b")
    assert b.manifest["options"]["fleet"]["prometheus"] == url


def test_credentials_are_not_shown_while_observing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time
    from types import SimpleNamespace

    import diagnose.fleet.attach as fa

    offset = [0.0]
    real_sleep = asyncio.sleep

    async def fast_sleep(s: float, *a: Any) -> None:
        if s <= 0:
            return await real_sleep(0)
        offset[0] += s

    monkeypatch.setattr(fa.asyncio, "sleep", fast_sleep)
    monkeypatch.setattr(fa, "time", SimpleNamespace(time=lambda: time.time() + offset[0], strftime=time.strftime))
    with serve(Hostile()) as url:
        r = CliRunner().invoke(cli, ["attach", "--prometheus", _cred_url(url), "--selector", SEL, "--observe", "-d",
                                     "40s", "-o", str(tmp_path / "b")])
    assert r.exit_code == 0, r.stderr
    assert "observing the fleet at http://127.0.0.1:" in r.stderr
    _no_secret_anywhere(r, tmp_path)


# -- values ---------------------------------------------------------------------------------------------------
def _set_values(pick: Callable[[str, int], str | None]) -> Callable[[str, dict[str, Any]], None]:
    def f(query: str, data: dict[str, Any]) -> None:
        i = 0
        for r in data["result"]:
            for p in r.get("values", []) + ([r["value"]] if "value" in r else []):
                v = pick(query, i)
                if v is not None:
                    p[1] = v
                i += 1
    return f


def test_an_answer_of_only_nan_is_a_one_line_error(tmp_path: Path) -> None:
    with serve(Hostile(_set_values(lambda q, i: ("NaN", "+Inf", "-Inf")[i % 3]))) as url:
        r = _run(_cred_url(url), tmp_path / "b")
    assert r.exit_code == 3, r.stderr
    line = _one_line(r)
    assert "no usable value" in line and "NaN or infinite" in line
    assert "No bottleneck found" not in r.output + r.stderr
    assert not (tmp_path / "b").exists()


def _fleet_values(root: Path) -> list[float]:
    b = open_bundle(root)
    vals: list[Any] = [v for rec in b.records("fleet_series") for v in rec["value"]]
    vals += [rec["value"] for rec in b.records("fleet_totals")]
    vals += [s[2] for rec in b.records("fleet_metrics") for s in rec["samples"]]
    return vals


def test_nan_and_inf_values_are_dropped_and_counted(tmp_path: Path) -> None:
    # every 7th value of the aggregated answers (not the histogram quantiles, which may be NaN already)
    with serve(Hostile(_set_values(lambda q, i: ("NaN" if i % 2 else "+Inf") if i % 7 == 3 else None))) as url:
        r = _run(_cred_url(url), tmp_path / "b")
    assert r.exit_code == 0, r.stderr
    assert "NaN or infinite" in r.stderr and "dropped" in r.stderr
    vals = _fleet_values(tmp_path / "b")
    assert vals and all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals)
    st = open_bundle(tmp_path / "b").manifest["probes"]["fleet"]
    assert st["detail"]["dropped"]["non_finite"] > 0


def test_values_outside_their_physical_range_are_skipped_and_counted(tmp_path: Path) -> None:
    def f(query: str, data: dict[str, Any]) -> None:
        for r in data["result"]:
            for p in r.get("values", []) + ([r["value"]] if "value" in r else []):
                if "kv_cache_usage_perc" in query and "by (" in query:
                    p[1] = "1e308"
                elif "num_requests_waiting" in query and "by (" in query:
                    p[1] = "-5"
                elif "request_success_total" in query and "increase" in query:
                    p[1] = "1e300"

    with serve(Hostile(f)) as url:
        r = _run(_cred_url(url), tmp_path / "b", "--report", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.stderr
    assert "outside their range" in r.stderr
    b = open_bundle(tmp_path / "b")
    kv = [v for rec in b.records("fleet_series") if rec["query"] == "kv_usage" for v in rec["value"]]
    waiting = [v for rec in b.records("fleet_series") if rec["query"] == "waiting" for v in rec["value"]]
    reqs = [rec["value"] for rec in b.records("fleet_totals") if rec["query"] == "requests"]
    assert not kv and not waiting and not reqs
    assert all(abs(v) <= 1e18 for v in _fleet_values(tmp_path / "b"))
    assert b.manifest["probes"]["fleet"]["detail"]["dropped"]["out_of_range"] > 0
    assert "1e+308" not in (tmp_path / "r.html").read_text() and "1e308" not in (tmp_path / "r.html").read_text()


def test_wrongly_shaped_entries_are_skipped_and_counted(tmp_path: Path) -> None:
    def f(query: str, data: dict[str, Any]) -> None:
        res = data["result"]
        if not res:
            return
        first = res[0]
        if "values" in first:
            first["values"][0] = [first["values"][0][0]]  # a point without a value
            first["values"][1] = ["soon", "1"]  # a time that is not a number
            first["values"][2] = [first["values"][2][0], {"v": 1}]  # a value that is not a number
            first["values"][3] = "17"  # a point that is not a pair
            res.append({"metric": {"instance": {"nested": 1}, "job": "vllm"}, "values": [[1, "1"]]})
            res.append({"metric": {"instance": "x:1", "job": "vllm"}, "values": "oops"})
        else:
            res.append({"metric": {"instance": "x:2", "job": "vllm"}, "value": "7"})
            res.append({"metric": {"instance": "x:3", "job": "vllm"}, "value": [None, "7"]})
        res.append(["not", "an", "entry"])
        res.append({"metric": ["not", "labels"]})

    with serve(Hostile(f)) as url:
        r = _run(_cred_url(url), tmp_path / "b")
    assert r.exit_code == 0, r.stderr
    assert "diagnose: internal error" not in r.stderr and "malformed" in r.stderr
    b = open_bundle(tmp_path / "b")
    assert b.manifest["probes"]["fleet"]["detail"]["dropped"]["malformed"] > 0
    names = {rec["name"] for rec in b.records("fleet_replicas")}
    assert not any("nested" in n or "x:" in n for n in names), names


# -- size -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["huge", "huge_length"])
def test_an_answer_over_the_size_cap_is_a_one_line_error(mode: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnose.probes.prometheus_api as pa

    monkeypatch.setattr(pa, "MAX_RESPONSE_BYTES", 1 << 20, raising=False)  # 1 MiB for the test (64 MiB by default)
    with serve(Hostile(mode=mode, spare=1)) as url:
        r = _run(_cred_url(url), tmp_path / "b")
    assert r.exit_code == 3, r.stderr
    line = _one_line(r)
    assert "answer is larger than 1 MiB" in line and "/api/v1/" in line


def test_the_default_size_cap_is_64_mib() -> None:
    import diagnose.probes.prometheus_api as pa

    assert getattr(pa, "MAX_RESPONSE_BYTES", None) == 64 << 20


# -- usage errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "want"), [
    (["--prometheus", "localhost:9090"], "expected http://HOST:PORT"),
    (["--prometheus", "ftp://127.0.0.1:9090"], "expected http://HOST:PORT"),
    (["--prometheus", "http://"], "expected http://HOST:PORT"),
    (["--prometheus", "http://127.0.0.1:99999"], "out of range"),
    (["--prometheus", f"ftp://{USER}:{PASSWORD}@127.0.0.1:9090"], "expected http://HOST:PORT"),
    (["--prometheus", "http://127.0.0.1:1", "--selector", '{job=~"("}'], "not a valid regular expression"),
    (["--prometheus", "http://127.0.0.1:1", "--selector", '{job=~"vllm[0-"}'], "not a valid regular expression"),
    (["--prometheus", "http://127.0.0.1:1", "--selector", r'{job=~"vllm-\d+"}'], "has the escape \\d"),
])
def test_usage_errors_exit_2(args: list[str], want: str) -> None:
    r = CliRunner().invoke(cli, ["attach", *args])
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    line = _one_line(r)
    assert want in line
    for s in SECRETS:
        assert s not in r.stderr
