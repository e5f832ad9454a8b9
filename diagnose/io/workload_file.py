"""Replayable workload files (docs/workload.md): read them (diagnose's own JSONL, Mooncake-style JSONL, the
Azure LLM inference trace CSV), write them, and derive one from a bundle's own request records.

A workload file holds, per request, an arrival offset, input and output token counts, optionally a session
id and turn, and the hashes of its leading prompt blocks (which requests share which prefix) -- never text.
Reading is strict per record and lenient per file: a record that does not fit is skipped and counted (the
first one is named with its file and line), a file with no readable record is an error naming its first bad
line. Formats are told apart by extension (``.csv``: Azure) and by the first record's fields.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import math
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import orjson
from msgspec import Meta

from diagnose.capture.workload import Replay, ReplayRequest
from diagnose.errors import DiagnoseError, InputError
from diagnose.io.lines import Skips, raw_lines
from diagnose.io.manifest import Workload
from diagnose.io.schemas import WORKLOAD_FILE
from diagnose.io.workload_store import MAX_GAP_S, MAX_REPLAY_SPAN_S, RequestStore, check_span, human_s

if TYPE_CHECKING:
    from diagnose.io.bundle import Bundle

FORMAT_VERSION = WORKLOAD_FILE  # the header's diagnose_workload and schema_version (diagnose/io/schemas.py)
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default KV-cache block: prefix caching hits whole blocks of this many tokens
MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces hash blocks of 512 tokens
MAX_TOKENS = 10_000_000
MIN_SPEED, MAX_SPEED = 1e-3, 1e6  # --speed: a replay at most 1000 times slower or a million times faster
MAX_LOOP = 1_000_000

Offset = Annotated[float, Meta(ge=0, le=1e9)]
Tokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
Hash = str | int


class _Header(msgspec.Struct, forbid_unknown_fields=False):
    diagnose_workload: Annotated[int, Meta(ge=1, le=FORMAT_VERSION)]
    schema_version: Annotated[int, Meta(ge=1, le=FORMAT_VERSION)] | None = None  # the same number, since v1
    block_tokens: Annotated[int, Meta(ge=1, le=1_000_000)] = DEFAULT_BLOCK_TOKENS


class _Diag(msgspec.Struct, forbid_unknown_fields=False):
    offset_s: Offset
    input_tokens: Tokens
    output_tokens: Tokens
    session: str | int | None = None
    turn: Annotated[int, Meta(ge=0, le=1_000_000)] | None = None
    prefix: list[Hash] = []


class _Mooncake(msgspec.Struct, forbid_unknown_fields=False):
    timestamp: Annotated[float, Meta(ge=0, le=1e12)]  # ms
    input_length: Tokens
    output_length: Annotated[int, Meta(ge=0, le=MAX_TOKENS)]
    hash_ids: list[Hash] = []




def read_workload(path: Path, *, speed: float = 1.0, loop: int = 1, bounded: bool = False) -> Replay:
    """The workload in ``path`` (format detected), offsets made relative to its first request and sorted.

    Read line by line; only the fields a replay needs are kept, compactly (diagnose/io/workload_store.py). A
    replay longer than ``MAX_REPLAY_SPAN_S`` or with a gap over ``MAX_GAP_S`` (--speed and --loop applied)
    is refused with the file and line of the record that makes it so; ``bounded`` (--duration or --num-requests
    ends the replay anyway): only the gap is checked."""
    if not path.exists():
        raise InputError(f"--workload {path}: no such file")
    if not path.is_file():
        raise InputError(f"--workload {path}: not a regular file")
    if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise InputError(f"--speed {speed:g}: must be a positive factor from {MIN_SPEED:g} to {MAX_SPEED:g} "
                         "(2 = twice as fast)")
    if not 1 <= loop <= MAX_LOOP:
        raise InputError(f"--loop {loop}: must be 1 to {MAX_LOOP}")
    skips = _Skips(path)
    try:
        if path.suffix.lower() == ".csv" or path.name.lower().endswith(".csv.gz"):
            fmt, block, what = "azure", DEFAULT_BLOCK_TOKENS, "TIMESTAMP"
            reqs = _read_azure(path, skips)
        else:
            n, first = _first_line(path)
            try:
                head = orjson.loads(first)
            except orjson.JSONDecodeError:
                head = None
            if head is None and first.startswith(b"TIMESTAMP"):
                fmt, block, what = "azure", DEFAULT_BLOCK_TOKENS, "TIMESTAMP"
                reqs = _read_azure(path, skips)
            elif isinstance(head, dict) and ("diagnose_workload" in head or "offset_s" in head):
                fmt, what = "diagnose", "offset_s"
                block, reqs = _read_diag(path, skips)
            elif isinstance(head, dict) and "timestamp" in head and "input_length" in head:
                fmt, block, what = "mooncake", MOONCAKE_BLOCK_TOKENS, "timestamp"
                reqs = _read_mooncake(path, skips)
            else:
                raise InputError(f"{path}:{n}: not a workload file: expected diagnose's JSONL (offset_s, "
                                 "input_tokens, output_tokens), Mooncake JSONL (timestamp, input_length, "
                                 "output_length, hash_ids) or an Azure trace CSV (TIMESTAMP, ContextTokens, "
                                 "GeneratedTokens)")
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    note = skips.finish(len(reqs))
    reqs.freeze()
    check_span(str(path), reqs, speed, loop, what, span=not bounded)
    return Replay(file=str(path), format=fmt, block_tokens=block, requests=reqs, speed=speed, loop=loop,
                  skipped=skips.n, note=note)


class _Skips(Skips):
    """Skips of a workload file, whose note or error names it as one."""

    def finish(self, got: int) -> str:
        if got == 0:
            raise InputError(self.first or f"{self.path}: no request in it")
        return f"{self.path}: skipped {self.n} unreadable record(s) (first: {self.first})" if self.n else ""


def _first_line(path: Path) -> tuple[int, bytes]:
    for n, line in raw_lines(path, None):
        return n, line
    raise InputError(f"{path}: empty workload file (no request in it)")


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _blocks(tokens: int, block: int) -> int:
    """Prefix blocks a prompt of ``tokens`` can hold: hashes beyond them describe no token and are not kept."""
    return -(-tokens // block)


def _read_diag(path: Path, skips: _Skips) -> tuple[int, RequestStore]:
    dec = msgspec.json.Decoder(_Diag)
    block = DEFAULT_BLOCK_TOKENS
    out = RequestStore()
    for n, line in raw_lines(path, skips):
        if not len(out) and not skips.n and b"diagnose_workload" in line:
            try:
                block = msgspec.json.decode(line, type=_Header).block_tokens
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                raise InputError(f"{path}:{n}: bad header: {_why(e)}") from None
            continue
        try:
            r = dec.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            skips.add(n, _why(e))
            continue
        out.add(n, r.offset_s, r.input_tokens, r.output_tokens, None if r.session is None else str(r.session),
                r.turn, r.prefix[:_blocks(r.input_tokens, block)])
    return block, out


def _read_mooncake(path: Path, skips: _Skips) -> RequestStore:
    dec = msgspec.json.Decoder(_Mooncake)
    out = RequestStore()
    for n, line in raw_lines(path, skips):
        try:
            r = dec.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            skips.add(n, _why(e))
            continue
        out.add(n, r.timestamp / 1000.0, r.input_length, max(1, r.output_length),
                prefix=r.hash_ids[:_blocks(r.input_length, MOONCAKE_BLOCK_TOKENS)])
    return out


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TS = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?)?"
                 r"\s*(Z|[+-]\d{2}:?\d{2})?")
_EPOCH = datetime.datetime(1970, 1, 1)


def azure_time_us(text: str) -> int | None:
    """An ISO 8601 date-time (``2023-11-16 18:15:46.6805900``; up to 9 fraction digits, an optional zone,
    none read as UTC) as integer microseconds since 1970, or None."""
    m = _TS.fullmatch(text.strip())
    if not m:
        return None
    y, mo, d, hh, mi, ss, frac, tz = m.groups()
    try:
        t = datetime.datetime(int(y), int(mo), int(d), int(hh or 0), int(mi or 0), int(ss or 0))
    except ValueError:
        return None
    us = (t - _EPOCH) // datetime.timedelta(microseconds=1) + (int((frac + "000000")[:6]) if frac else 0)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "+" else 1
        digits = tz[1:].replace(":", "")
        us += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60) * 1_000_000
    return us


def _int_field(text: str) -> int | None:
    t = text.strip()
    if not t or len(t) > 20:
        return None
    try:
        return int(t)
    except ValueError:
        try:
            v = float(t)
        except ValueError:
            return None
        return int(v) if math.isfinite(v) and v == int(v) else None


def _read_azure(path: Path, skips: _Skips) -> RequestStore:
    """The Azure LLM trace CSV, one row at a time (rows whose field count differs from the header's, bad
    dates and bad numbers skipped and counted with their line)."""
    where = {"line": 0}

    def texts() -> Iterator[str]:
        for n, raw in raw_lines(path, skips):
            where["line"] = n
            yield raw.decode("utf-8", "replace")

    rows = csv.reader(texts(), skipinitialspace=True)
    header: list[str] | None = None
    out = RequestStore()
    t_first: int | None = None
    cols = (0, 0, 0)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as e:
            skips.add(where["line"], f"not a CSV row: {_why(e)}")
            continue
        n = where["line"]
        if header is None:
            header = [c.strip().lstrip("\ufeff") for c in row]
            missing = [c for c in AZURE_COLUMNS if c not in header]
            if missing:
                raise InputError(f"{path}:{n}: not an Azure LLM trace CSV: missing column(s) {', '.join(missing)} "
                                 f"(expected {', '.join(AZURE_COLUMNS)})")
            cols = (header.index("TIMESTAMP"), header.index("ContextTokens"), header.index("GeneratedTokens"))
            continue
        if len(row) != len(header):
            skips.add(n, f"{len(row)} fields where the header has {len(header)}")
            continue
        ts, ctx, gen = (row[c] for c in cols)
        us, c, g = azure_time_us(ts), _int_field(ctx), _int_field(gen)
        if us is None or c is None or g is None or not 1 <= c <= MAX_TOKENS or not 0 <= g <= MAX_TOKENS:
            skips.add(n, f"bad TIMESTAMP, ContextTokens or GeneratedTokens: {ts[:40]!r}, {ctx[:20]!r}, {gen[:20]!r}")
            continue
        if t_first is None:
            t_first = us
        out.add(n, (us - t_first) / 1e6, c, max(1, g))
    if header is None:
        raise InputError(f"{path}: empty workload file (no request in it)")
    return out


# -- prefix sharing ------------------------------------------------------------------------------------------
# -- writing ----------------------------------------------------------------------------------------------
def encode_workload(reqs: Sequence[ReplayRequest], *, block_tokens: int, source: str) -> bytes:
    """The file: one header line, then one line per request (fields left out when empty)."""
    head = {"schema_version": FORMAT_VERSION, "diagnose_workload": FORMAT_VERSION, "block_tokens": block_tokens, "source": source,
            "requests": len(reqs)}
    lines = [orjson.dumps(head)]
    for r in reqs:
        d: dict[str, Any] = {"offset_s": round(r.offset_s, 6), "input_tokens": r.input_tokens,
                             "output_tokens": r.output_tokens, **r.structure()}
        lines.append(orjson.dumps(d))
    return b"\n".join(lines) + b"\n"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def from_bundle(bundle: Bundle) -> tuple[list[ReplayRequest], int, str]:
    """The replayable workload of a bundle's own request records: (requests, block_tokens, note).

    Offsets come from each request's intended send time (its schedule), else its actual one; the baseline
    phase (diagnose's own reference) is left out. Input tokens: the planned length where /tokenize made it
    exact, else the server's usage count, else the plan; output tokens: what the server produced for a request
    that succeeded, else what was asked. Prefix groups: a replayed bundle's recorded block hashes; a synthetic
    run's shared prefix (the same for every request) as whole blocks of ``DEFAULT_BLOCK_TOKENS``. An
    observe-mode bundle has no request records: its workload comes from the server's telemetry
    (diagnose/signals/observed.py)."""
    recs = bundle.records("requests") if bundle.has_stream("requests") else []
    if not recs:
        if bundle.meta.workload is not None and bundle.meta.workload.mode == "observe":
            return _from_observed(bundle)
        raise DiagnoseError(f"{bundle.path}: no request records to derive a workload from (the capture recorded "
                            "no request)")
    wl = bundle.meta.workload or Workload()
    baseline = {p.get("phase") for p in bundle.records("phases") if p.get("role") == "baseline"} \
        if bundle.has_stream("phases") else set()
    baseline |= {p.index for p in wl.phases if p.role == "baseline"}
    block = _int(wl.replay.block_tokens if wl.replay is not None else None) or DEFAULT_BLOCK_TOKENS
    load = next((s for s in bundle.meta.probes if s.name == "load"), None)
    shared_tokens = _int((load.detail if load else {}).get("shared_prefix_tokens"))
    frac = wl.shared_prefix_fraction
    rows: list[tuple[int, ReplayRequest]] = []
    salt = ""
    for r in recs:
        if r.get("phase") in baseline:
            continue
        t = _int(r.get("intended_ns")) or _int(r.get("sent_ns"))
        if t is None:
            continue
        planned, usage = _int(r.get("prompt_tokens")), _int(r.get("prompt_tokens_usage"))
        inp = planned if r.get("prompt_tokens_source") == "tokenize" and planned else (usage or planned or 1)
        out = _int(r.get("max_tokens")) or 1
        if r.get("ok"):
            out = _int(r.get("output_tokens_usage")) or _int(r.get("output_tokens_chunks")) or out
        prefix: tuple[str, ...] = ()
        if isinstance(r.get("prefix"), list):
            prefix = tuple(str(h) for h in r["prefix"])
        elif shared_tokens or (shared_tokens is None and isinstance(frac, (int, float)) and frac > 0):
            # the load probe's note; an older bundle: estimated from the fraction as the prompts cut it
            words = shared_tokens if shared_tokens is not None else round(float(frac or 0) * max(0, (planned or inp) - 1))
            salt = salt or str(r.get("rid", "")).rsplit("-", 1)[0]
            prefix = tuple(hashlib.sha256(f"{salt}:{j}".encode()).hexdigest()[:16] for j in range(words // block))
        session = r.get("session")
        rows.append((t, ReplayRequest(offset_s=0.0, input_tokens=max(1, inp), output_tokens=max(1, out),
                                      session=None if session is None else str(session),
                                      turn=_int(r.get("turn")), prefix=prefix)))
    if not rows:
        raise DiagnoseError(f"{bundle.path}: no request outside the baseline phase has a send time; "
                            "nothing to derive a workload from")
    rows.sort(key=lambda x: x[0])
    t0 = rows[0][0]
    reqs = [ReplayRequest(offset_s=(t - t0) / 1e9, input_tokens=q.input_tokens, output_tokens=q.output_tokens,
                          session=q.session, turn=q.turn, prefix=q.prefix) for t, q in rows]
    _warn_span(bundle, reqs)
    mode = wl.mode
    note = ("from a concurrency run: closed-loop sends (each when a request ended) become fixed offsets"
            if mode == "concurrency" else f"from a {mode} run" if mode else "from a load run")
    return reqs, block, note


def _warn_span(bundle: Bundle, reqs: Sequence[ReplayRequest]) -> None:
    """A warning (on the bundle, which ``diagnose workload`` prints) when the file written would be refused by
    ``attach --workload`` at --speed 1: it spans more than ``MAX_REPLAY_SPAN_S`` or has a gap over
    ``MAX_GAP_S`` (a request record whose send time is far from the others')."""
    span = reqs[-1].offset_s if reqs else 0.0
    # the file's line 1 is its header: request i (0-based) is line i + 2
    gap, at = max(((b.offset_s - a.offset_s, i + 3) for i, (a, b) in enumerate(zip(reqs, reqs[1:], strict=False))),
                  default=(0.0, 0))
    if span > MAX_REPLAY_SPAN_S:
        med = reqs[(len(reqs) - 1) // 2].offset_s
        i = 0 if med > span - med else len(reqs) - 1  # the request farthest from the median: the outlier
        bundle.warn(f"the workload spans {human_s(span)} (line {i + 2} of the file, offset_s {reqs[i].offset_s:g}, "
                    f"is that far from the others): attach --workload replays at most {human_s(MAX_REPLAY_SPAN_S)}, "
                    f"so replay it with --speed {span / MAX_REPLAY_SPAN_S:.3g} or more, or drop that line")
    elif gap > MAX_GAP_S:
        bundle.warn(f"the workload has {human_s(gap)} with no request before line {at} of the file: attach "
                    f"--workload waits at most {human_s(MAX_GAP_S)}, so replay it with --speed "
                    f"{gap / MAX_GAP_S:.3g} or more")


def _from_observed(bundle: Bundle) -> tuple[list[ReplayRequest], int, str]:
    """The workload of an observe-mode bundle, from the server's counters and length histograms over the
    capture, or its request spans where they cover the traffic (diagnose/signals/observed.py), in blocks of the
    server's KV block size where it stated one."""
    from diagnose.analysis import Window
    from diagnose.normalize import otel, prometheus
    from diagnose.signals.observed import observed_requests

    tables = prometheus.tables(bundle) if bundle.has_stream("metrics") else {}
    if tables and bundle.has_stream("spans"):  # the engine's request spans (attach --observe --otlp)
        tables.update(otel.tables(bundle))
    scrapes = tables.get("metrics_scrapes")
    if scrapes is None or len(scrapes) < 2:
        raise DiagnoseError(f"{bundle.path}: an observe-mode capture with fewer than two metrics scrapes; "
                            "nothing to derive a workload from")
    cfg = tables.get("server_config")
    block = DEFAULT_BLOCK_TOKENS
    if cfg is not None and "kv_block_size_tokens" in set(cfg["key"]):
        block = max(1, int(cfg.loc[cfg["key"] == "kv_block_size_tokens", "value"].iloc[0]))
    window = Window(float(scrapes["t_s"].min()), float(scrapes["t_s"].max()))
    try:
        reqs, note = observed_requests(tables, window, block)
    except ValueError as e:
        raise DiagnoseError(f"{bundle.path}: cannot derive a workload from observed traffic: {e}") from e
    _warn_span(bundle, reqs)
    return reqs, block, note
