"""Issue 33: the workload surfaces hardened. A corpus of hostile workload files in every format (diagnose
JSONL, Mooncake JSONL, Azure trace CSV), each giving a one-line error naming the file and line or a counted
skip, never a traceback, a hang or a replay of decades; memory that grows with the requests kept, not the
file; every replay option checked (exit 2, one line); --duration as wall time for a replay; an SLO value
without a unit refused; and every request the server completed accounted for in the bundle.
Promises: docs/robustness.md, part 3."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diagnose.capture.workload import Phase, WorkloadSpec, parse_slo
from diagnose.errors import InputError
from diagnose.io.bundle import open_bundle
from diagnose.io.workload_file import read_workload
from diagnose.io.writer import BundleWriter
from tests.load_testserver import TestServer
from tests.test_load_probe import run_probe, spec_for

DIAG = [sys.executable, "-m", "diagnose"]
HEAD = '{"diagnose_workload": 1, "block_tokens": 16}\n'
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def diag(*offsets: Any) -> str:
    return HEAD + "".join(f'{{"offset_s": {o}, "input_tokens": 20, "output_tokens": 3}}\n' for o in offsets)


def moon(*stamps: Any) -> str:
    return "".join(f'{{"timestamp": {t}, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}}\n'
                   for t in stamps)


def azure(*rows: str) -> str:
    return AZ + "".join(r + "\n" for r in rows)


GOOD_AZ = "2023-11-16 18:15:46.6805900,100,20"
BIG = 17 << 20  # longer than the longest line read (16 MiB)

# (file name, content, read_workload keyword arguments, the one-line error's expected parts)
ERRORS: list[tuple[str, str | bytes, dict[str, Any], tuple[str, ...]]] = [
    ("outlier.jsonl", diag(0, 0.5, 1, "1e9"), {}, ("outlier.jsonl:5:", "31.7 years", "at most 7 days")),
    ("two.jsonl", diag(0, "1e9"), {}, ("two.jsonl:3: this record's offset_s",)),  # a tie names the later one
    ("moon_1e12.jsonl", moon(0, 1000, "1e12"), {}, ("moon_1e12.jsonl:3:", "timestamp", "31.7 years")),
    ("centuries.csv", azure(GOOD_AZ, "1700-01-01 00:00:00,5,5", "2200-01-01 00:00:00,5,5"), {},
     ("centuries.csv:3:", "TIMESTAMP", "years")),
    ("gap.jsonl", diag(0, 1, 7201), {}, ("gap.jsonl:4:", "offset_s is 2 h after the previous one", "at most 60 min")),
    ("loops.jsonl", diag(0, 60, 120), {"loop": 100_000}, ("loops.jsonl:", "--loop 100000", "at most 7 days")),
    ("slow.jsonl", diag(0, 300, 700), {"speed": 0.001}, ("slow.jsonl:", "8.1 days", "--speed 0.001")),
    ("tiny-speed.jsonl", diag(0, 1), {"speed": 1e-12}, ("--speed 1e-12: must be a positive factor",)),
    ("nan-speed.jsonl", diag(0, 1), {"speed": float("nan")}, ("--speed nan: must be a positive factor",)),
    ("inf-speed.jsonl", diag(0, 1), {"speed": float("inf")}, ("--speed inf: must be a positive factor",)),
    ("zero-loop.jsonl", diag(0, 1), {"loop": 0}, ("--loop 0: must be 1 to",)),
    ("empty.jsonl", "", {}, ("empty.jsonl: empty workload file",)),
    ("blank.jsonl", "\n  \n\t\n", {}, ("blank.jsonl: empty workload file",)),
    ("binary.jsonl", bytes(random.Random(7).randrange(256) for _ in range(4096)).replace(b"\n", b" "), {},
     ("binary.jsonl:1: not a workload file",)),
    ("huge-first.jsonl", b"x" * BIG + b"\n" + diag(0).encode(), {}, ("huge-first.jsonl:1: a line longer than 16 MiB",)),
    ("allbad.jsonl", HEAD + '{"offset_s": -1, "input_tokens": 3, "output_tokens": 1}\n', {}, ("allbad.jsonl:2:",)),
    ("header-only.csv", AZ, {}, ("header-only.csv: no request in it",)),
    ("ragged-only.csv", azure("2023-11-16 18:15:46,1,1,1", "2023-11-16 18:15:47,1"), {},
     ("ragged-only.csv:2: 4 fields where the header has 3",)),
    ("columns.csv", "TIMESTAMP,Tokens\n2023-01-01 00:00:00,3\n", {}, ("columns.csv:1: not an Azure LLM trace CSV",)),
    ("broken.csv.gz", b"\x1f\x8b\x08\x00garbage", {}, ("cannot read", "broken.csv.gz")),
]

# (file name, content, requests read, records skipped, the warning's file:line of the first skipped record)
SKIPS: list[tuple[str, str | bytes, int, int, str]] = [
    ("ragged.csv", azure(GOOD_AZ, "2023-11-16 18:15:47,5,5,9", "2023-11-16 18:15:48,5", "2023-11-16 18:15:49,7,1"),
     2, 2, "ragged.csv:3: 4 fields where the header has 3"),
    # the exit-70 case: a longer first data row made pandas take the first column for the index
    ("ragged-first.csv", azure("2023-11-16 18:15:46,5,5,9", GOOD_AZ, "2023-11-16 18:15:49,7,1"), 2, 1,
     "ragged-first.csv:2: 4 fields"),
    ("nan.csv", azure(GOOD_AZ, "2023-11-16 18:15:47,nan,5", "2023-11-16 18:15:48,5,inf", "2023-11-16 18:15:49,-3,1",
                      "not a date,5,5"), 1, 4, "nan.csv:3: bad TIMESTAMP"),
    ("latin1.csv", AZ.encode() + GOOD_AZ.encode() + b"\n2023-11-16 18:15:47,5\xff,5\n", 1, 1, "latin1.csv:3:"),
    ("bom.csv", "\ufeff" + azure(GOOD_AZ, "2023-11-16 18:15:47,5,x"), 1, 1, "bom.csv:3:"),
    ("values.jsonl", HEAD + '{"offset_s": -1, "input_tokens": 3, "output_tokens": 1}\n'
     '{"offset_s": NaN, "input_tokens": 3, "output_tokens": 1}\n'
     '{"offset_s": 1e999, "input_tokens": 3, "output_tokens": 1}\n'
     '{"offset_s": 1, "input_tokens": -5, "output_tokens": 1}\n'
     '{"offset_s": 2, "input_tokens": 5, "output_tokens": 1}\n', 1, 4, "values.jsonl:2:"),
    ("nonutf8.jsonl", HEAD.encode() + b'{"offset_s": 0, "input_tokens": 3, "output_tokens": 1, "session": "\xff\xfe"}\n'
     + diag(1).encode()[len(HEAD):], 1, 1, "nonutf8.jsonl:2:"),
    ("huge-line.jsonl", diag(0).encode() + b'{"offset_s": 1, "pad": "' + b"y" * BIG + b'"}\n' + diag(2).encode()[len(HEAD):],
     2, 1, "huge-line.jsonl:3: line longer than 16 MiB"),
    ("moon-bad.jsonl", moon(0, 5) + '{"timestamp": -1, "input_length": 5, "output_length": 1}\n[1, 2]\n', 2, 2,
     "moon-bad.jsonl:3:"),
]


class StallServer(TestServer):
    """Streams two tokens of every request and then nothing (the option preflight alone is answered)."""

    __test__ = False

    async def completions(self, request: Any) -> Any:
        self.mode = "ok" if request.headers.get("x-request-id", "").endswith("preflight") else "stall"
        return await super().completions(request)


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    p = tmp / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


@pytest.mark.parametrize(("name", "content", "kw", "parts"), ERRORS, ids=[c[0] for c in ERRORS])
def test_hostile_workload_file_is_one_line_naming_file_and_line(tmp_path: Path, name: str, content: str | bytes,
                                                                kw: dict[str, Any], parts: tuple[str, ...]) -> None:
    with pytest.raises(InputError) as e:
        read_workload(write(tmp_path, name, content), **kw)
    msg = str(e.value)
    assert "\n" not in msg and all(p in msg for p in parts), msg


@pytest.mark.parametrize(("name", "content", "n", "skipped", "first"), SKIPS, ids=[c[0] for c in SKIPS])
def test_hostile_records_are_skipped_and_counted_with_their_line(tmp_path: Path, name: str, content: str | bytes,
                                                                 n: int, skipped: int, first: str) -> None:
    rp = read_workload(write(tmp_path, name, content))
    assert len(rp.requests) == n and rp.skipped == skipped, rp.note
    assert f"skipped {skipped} unreadable record(s) (first: {tmp_path / first}" in rp.note, rp.note


def test_a_fifo_or_a_directory_is_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "w.jsonl")  # opening it for reading would block until a writer comes
    for p in (tmp_path / "w.jsonl", tmp_path):
        with pytest.raises(InputError, match="not a regular file"):
            read_workload(p)


def test_a_span_that_fits_after_speed_is_replayed(tmp_path: Path) -> None:
    """The bounds apply after --speed: the 2 h gap that is refused at speed 1 is 30 min at speed 4."""
    rp = read_workload(write(tmp_path, "gap.jsonl", diag(0, 1, 7201)), speed=4)
    assert [r.offset_s for r in rp.requests] == [0, 1, 7201] and rp.speed == 4
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress(azure(GOOD_AZ, "2023-11-16 18:15:47.6805900,7,0").encode()))
    rp = read_workload(gz)
    assert [(r.offset_s, r.input_tokens, r.output_tokens) for r in rp.requests] == [(0, 100, 20), (1, 7, 1)]


# -- memory: the requests kept, not the file ----------------------------------------------------------------
def peak_bytes(path: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        rp = read_workload(path)
        return len(rp.requests), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_keeps_memory_proportional_to_the_requests_not_the_file(tmp_path: Path) -> None:
    """A Mooncake file whose lines carry an ignored 1 KB field and 64 block hashes each, and an Azure CSV:
    the old reader (a Python object per request, a string per hash; pandas for the CSV) peaked at 2.9 and 16
    times the file's size; the compact store needs 4 bytes a hash and under 50 bytes a request."""
    n = 5000
    with (tmp_path / "m.jsonl").open("w") as f:
        for i in range(n):
            f.write(json.dumps({"timestamp": i * 10, "input_length": 64 * 512, "output_length": 10,
                                "hash_ids": [j if j < 48 else i * 100 + j for j in range(64)], "pad": "x" * 1000})
                    + "\n")
    got, peak = peak_bytes(tmp_path / "m.jsonl")
    assert got == n and peak < n * (64 * 8 + 200) + (1 << 20), peak
    assert peak < (tmp_path / "m.jsonl").stat().st_size / 2
    rng = random.Random(3)
    with (tmp_path / "a.csv").open("w") as f:
        f.write(AZ)
        for i in range(50_000):
            f.write(f"2023-11-16 18:{i // 6000 % 60:02d}:{i // 100 % 60:02d}.{i % 100:02d}12345,"
                    f"{rng.randint(1, 4000)},{rng.randint(0, 500)}\n")
    got, peak = peak_bytes(tmp_path / "a.csv")
    assert got == 50_000 and peak < 50_000 * 64 + (1 << 20), peak


# -- the CLI: one line, exit 2, before anything connects ------------------------------------------------------
def cli(*args: str) -> Any:
    from diagnose.cli.main import cli as main

    return CliRunner().invoke(main, list(args))


def one_line(res: Any) -> str:
    assert res.exit_code == 2, (res.exit_code, res.stderr, res.exception)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("diagnose: error: ") and "Traceback" not in res.stderr, res.stderr
    return str(lines[0])


@pytest.mark.parametrize("name", ["outlier.jsonl", "moon_1e12.jsonl", "centuries.csv", "binary.jsonl",
                                  "ragged-only.csv", "empty.jsonl"])
def test_attach_with_a_hostile_workload_is_one_line_exit_2(tmp_path: Path, name: str) -> None:
    _, content, _, parts = next(c for c in ERRORS if c[0] == name)
    line = one_line(cli("attach", "--url", "http://127.0.0.1:9", "--workload", str(write(tmp_path, name, content)),
                        "-o", str(tmp_path / "b")))
    assert all(p in line for p in parts) and not (tmp_path / "b").exists(), line


@pytest.mark.parametrize(("args", "says"), [
    (("--speed", "0"), "--speed 0: must be a positive factor"),
    (("--speed", "-1"), "--speed -1: must be a positive factor"),
    (("--speed", "nan"), "--speed nan: must be a positive factor"),
    (("--speed", "inf"), "--speed inf: must be a positive factor"),
    (("--speed", "1e-12"), "--speed 1e-12: must be a positive factor"),
    (("--loop", "0"), "--loop 0: must be 1 to"),
    (("--loop", "-2"), "--loop -2: must be 1 to"),
    (("--max-concurrency", "0"), "--max-concurrency 0: must be 1 to"),
    (("--max-concurrency", "-1"), "--max-concurrency -1: must be 1 to"),
    (("-d", "0s"), "--duration 0s: must be more than 0"),
    (("-d", "0"), "--duration 0: must be more than 0"),
    (("-d", "0ms"), "--duration 0ms: must be more than 0"),
    (("-d", "9999h"), "--duration 9999h: must be more than 0 and at most 7 days"),
], ids=lambda v: "_".join(v) if isinstance(v, tuple) else None)
def test_replay_options_out_of_range_are_refused_not_replaced(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    f = write(tmp_path, "w.jsonl", diag(0, 1))
    assert says in one_line(cli("attach", "--url", "http://127.0.0.1:9", "--workload", str(f), *args,
                                "-o", str(tmp_path / "b")))
    if args[0] in ("-d", "--max-concurrency"):  # the same options with synthetic load
        assert says in one_line(cli("attach", "--url", "http://127.0.0.1:9", "-r", "5", *args,
                                    "-o", str(tmp_path / "b")))
    assert not (tmp_path / "b").exists()


def test_real_exit_status_and_no_traceback_for_a_ragged_azure_row(tmp_path: Path) -> None:
    """The case that exited 70 (internal error): now a counted skip, and the all-ragged file exit 2."""
    f = write(tmp_path, "r.csv", azure("2023-11-16 18:15:46,5,5,9", "2023-11-16 18:15:47,5"))
    p = subprocess.run([*DIAG, "attach", "--url", "http://127.0.0.1:9", "--workload", str(f), "-o",
                        str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines() == [f"diagnose: error: {f}:2: 4 fields where the header has 3"]


# -- an SLO needs its unit ----------------------------------------------------------------------------------
def test_slo_without_a_unit_is_refused_with_both_readings() -> None:
    with pytest.raises(InputError) as e:
        parse_slo("ttft_p99=500,itl_p99=50")
    assert str(e.value) == "--slo ttft_p99=500 has no unit: write 500ms or 0.5s"
    with pytest.raises(InputError, match="itl_p99=50 has no unit: write 50ms or 0.05s"):
        parse_slo("ttft_p99=500ms,itl_p99=50")
    for bad in ("ttft_p99=0ms", "ttft_p99=-1s", "ttft_p99=nan", "ttft_p99=infs", "ttft_p99=1e400s"):
        with pytest.raises(InputError, match="ttft_p99"):
            parse_slo(bad)
    assert parse_slo("ttft_p99=500ms,itl_p99=0.05s,e2e_p95=2m,tpot_p50=1.5e2ms") == {
        "ttft_p99_ms": 500.0, "itl_p99_ms": 50.0, "e2e_p95_ms": 120_000.0, "tpot_p50_ms": 150.0}


@pytest.mark.parametrize("mode", [(), ("--find-max-goodput",), ("--launch", "/bin/false")], ids=["attach", "search", "launch"])
def test_attach_slo_without_a_unit_is_one_line_before_anything_runs(tmp_path: Path, mode: tuple[str, ...]) -> None:
    line = one_line(cli("attach", "--url", "http://127.0.0.1:9", "-c", "2", "--slo", "ttft_p99=500,itl_p99=50ms",
                        *mode, "-o", str(tmp_path / "b")))
    assert line == "diagnose: error: --slo ttft_p99=500 has no unit: write 500ms or 0.5s"
    assert not (tmp_path / "b").exists()


# -- diagnose workload: an outlier is said --------------------------------------------------------------------
def test_diagnose_workload_warns_about_a_span_no_replay_accepts(tmp_path: Path) -> None:
    bw = BundleWriter(tmp_path / "b", workload={"mode": "rate"})
    t0 = 10**12
    bw.stream("requests", "requests").write_many([
        {"rid": f"r-{i}", "phase": 0, "warmup": False, "intended_ns": t0 + t, "sent_ns": t0 + t,
         "first_token_ns": t0 + t + 5, "end_ns": t0 + t + 10, "ok": True, "prompt_tokens": 10,
         "prompt_tokens_source": "tokenize", "max_tokens": 4, "output_tokens_usage": 4}
        for i, t in enumerate([0, 10**8, 2 * 10**8, 10**18])])
    bw.finish()
    res = cli("workload", str(tmp_path / "b"), "-o", str(tmp_path / "w.jsonl"))
    assert res.exit_code == 0, res.stderr
    warn = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "spans 31.7 years" in warn[0] and "line 5 of the file" in warn[0], res.stderr
    with pytest.raises(InputError, match="w.jsonl:5:"):  # and a replay of it names the same line
        read_workload(tmp_path / "w.jsonl")


# -- --duration with --workload is wall time --------------------------------------------------------------------
def test_replay_duration_is_wall_time_no_request_sent_after_it(tmp_path: Path) -> None:
    """Five requests due at once, a cap of one in flight, a server that never finishes a stream: the first
    request holds the cap until its timeout (4 s), past the 2 s --duration. The four queued behind the cap are
    not sent after the duration ended (they were, one after another, each waiting out its timeout: a "2 s"
    replay ran 20 s); the status counts them."""
    path = write(tmp_path, "w.jsonl", diag(0, 0, 0, 0, 0))
    rp = read_workload(path)
    spec = WorkloadSpec(mode="replay", phases=(Phase(index=0, name="replay", max_concurrency=1),), duration_s=2.0,
                        warmup_requests=0, input_tokens=8, output_tokens=8, replay=rp, request_timeout_s=4.0)
    status, b = asyncio.run(run_probe(StallServer(), spec, tmp_path / "b"))
    recs = b.records("requests")
    assert len(recs) == 1 and recs[0]["error"] == "timeout", recs
    assert status is not None and status.detail["replay_unsent"] == 4


# -- every request the server completed is in the bundle --------------------------------------------------------
def test_every_request_the_server_saw_is_accounted_for(tmp_path: Path) -> None:
    """The option preflight (a real completion the server counts) was in no stream and no status: the bundle
    held one request fewer than the server completed. Its status now lists it (and each rejected option set)."""
    srv = TestServer(reject=("continuous_usage_stats",))
    status, b = asyncio.run(run_probe(srv, spec_for("4", num_requests=8), tmp_path / "b"))
    assert status is not None
    pre = status.detail["preflight_requests"]
    assert [p["http_status"] for p in pre] == [400, 200] and pre[-1]["ok"] and pre[-1]["output_tokens"] == 2
    seen = [h["x-request-id"] for h in srv.headers]
    recorded = [r["rid"] for r in b.records("requests")] + [p["rid"] for p in pre]
    assert sorted(seen) == sorted(recorded)


def test_high_concurrency_bundle_matches_the_server_count(tmp_path: Path) -> None:
    """c=256 for 1 s against the truth server: its own record of every request it got, against the bundle."""
    import urllib.request

    from tests.servers.truth import truth_server

    with truth_server(ttft_ms=5, itl_ms=5) as (url, _):
        p = subprocess.run([*DIAG, "attach", "--url", url, "-c", "256", "-d", "1s", "--baseline", "0", "--warmup",
                            "0", "--output-tokens", "8", "--no-nvml", "--no-metrics", "-o", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr
        with urllib.request.urlopen(f"{url}/truth", timeout=30) as r:
            truth = json.loads(r.read())
    b = open_bundle(tmp_path / "b")
    load = next(s for s in b.meta.probes if s.name == "load")
    done = sorted(str(r["xid"]) for r in truth["records"] if r["done_us"] is not None)
    recorded = sorted([r["rid"] for r in b.records("requests")]
                      + [p["rid"] for p in load.detail["preflight_requests"] if p["ok"]])
    assert len(done) > 256 and done == recorded


def test_replay_duration_cuts_what_is_in_flight_after_a_grace(tmp_path: Path) -> None:
    """A request in flight when the --duration ends gets the grace an outside stop gives (5 s), then is
    cancelled and recorded incomplete with the reason; it used to hold the replay to its --timeout (60 s)."""
    rp = read_workload(write(tmp_path, "w.jsonl", diag(0)))
    spec = WorkloadSpec(mode="replay", phases=(Phase(index=0, name="replay"),), duration_s=1.0, warmup_requests=0,
                        input_tokens=8, output_tokens=8, replay=rp, request_timeout_s=60.0)
    status, b = asyncio.run(run_probe(StallServer(), spec, tmp_path / "b"))
    recs = b.records("requests")
    assert len(recs) == 1 and recs[0]["error"] == "incomplete", recs
    assert "--duration ended while the request was in flight" in recs[0]["error_detail"]
    assert status is not None and status.detail["replay_unsent"] == 0


def test_a_long_trace_is_accepted_when_duration_or_requests_bound_the_replay(tmp_path: Path) -> None:
    """8 days of arrivals every 50 min: refused as a whole replay, accepted with -d or -n (the replay ends
    anyway); a gap over an hour is refused either way (the 1700 row of an Azure trace, before the others)."""
    f = write(tmp_path, "week.jsonl", diag(*range(0, 8 * 86400, 3000)))
    with pytest.raises(InputError, match="week.jsonl:232: .* 7.99 days"):
        read_workload(f)
    assert len(read_workload(f, bounded=True).requests) == 231
    opts = ["attach", "--url", "http://127.0.0.1:9", "--workload", str(f)]
    from diagnose.cli.attach import attach
    from diagnose.probes.load import workload_from_options

    for extra in (["-d", "1h"], ["-n", "10"]):
        spec = workload_from_options(dict(attach.make_context("attach", [*opts[1:], *extra]).params))
        assert spec.replay is not None and len(spec.replay.requests) == 231
    az = write(tmp_path, "az.csv", azure(GOOD_AZ, "1700-01-01 00:00:00,5,5", "2023-11-16 18:15:47,5,5"))
    with pytest.raises(InputError, match="az.csv:3: this record's TIMESTAMP is 324 years before the next request"):
        read_workload(az, bounded=True)


def test_diagnose_workload_of_observed_traffic_warns_about_a_far_scrape(tmp_path: Path) -> None:
    """An observe-mode bundle whose last scrape is 10 days after the others (5 requests counted there): the
    arrivals spread over that interval make a file of 9 days; writing it says so."""
    import orjson

    from tests.test_observed import _known, write_observe_bundle

    write_observe_bundle(tmp_path / "obs", _known(40))
    lines = (tmp_path / "obs" / "metrics.jsonl").read_bytes().splitlines()
    last = orjson.loads(lines[-1])
    last["t_ns"] += 10 * 86400 * 10**9
    for s in last["samples"]:
        if s[0] == "vllm:request_success_total":
            s[2] += 5
    (tmp_path / "obs" / "metrics.jsonl").write_bytes(b"\n".join([*lines[:-1], orjson.dumps(last)]) + b"\n")
    res = cli("workload", str(tmp_path / "obs"), "-o", str(tmp_path / "w.jsonl"))
    assert res.exit_code == 0, res.stderr
    warn = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "spans 9 days" in warn[0] and "--speed 1.29 or more" in warn[0], res.stderr
