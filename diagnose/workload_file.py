"""Replayable workload files (docs/workload.md): read them (diagnose's own JSONL, Mooncake-style JSONL, the
Azure LLM inference trace CSV), write them, and derive one from a bundle's own request records.

A workload file holds, per request, an arrival offset, input and output token counts, optionally a session
id and turn, and the hashes of its leading prompt blocks (which requests share which prefix) -- never text.
Reading is strict per record and lenient per file: a record that does not fit is skipped and counted (the
first one is named with its file and line), a file with no readable record is an error naming its first bad
line. Formats are told apart by extension (``.csv``: Azure) and by the first record's fields.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import orjson
from msgspec import Meta

from diagnose.errors import DiagnoseError, InputError
from diagnose.workload import Replay, ReplayRequest

if TYPE_CHECKING:
    from diagnose.bundle import Bundle

FORMAT_VERSION = 1
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default KV-cache block: prefix caching hits whole blocks of this many tokens
MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces hash blocks of 512 tokens
MAX_TOKENS = 10_000_000

Offset = Annotated[float, Meta(ge=0, le=1e9)]
Tokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
Hash = str | int


class _Header(msgspec.Struct, forbid_unknown_fields=False):
    diagnose_workload: Annotated[int, Meta(ge=1, le=FORMAT_VERSION)]
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


def _first_line(path: Path) -> tuple[int, bytes]:
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                return n, line.strip()
    raise InputError(f"{path}: empty workload file (no request in it)")


def read_workload(path: Path, *, speed: float = 1.0, loop: int = 1) -> Replay:
    """The workload in ``path`` (format detected), offsets made relative to its first request and sorted."""
    if not path.is_file():
        raise InputError(f"--workload {path}: no such file")
    if speed <= 0 or not speed < 1e6:
        raise InputError(f"--speed {speed:g}: must be a positive factor (2 = twice as fast)")
    if loop < 1:
        raise InputError(f"--loop {loop}: must be 1 or more")
    try:
        if path.suffix.lower() == ".csv" or path.name.lower().endswith(".csv.gz"):
            fmt, block, reqs, skipped, note = "azure", DEFAULT_BLOCK_TOKENS, *_read_azure(path)
        else:
            n, first = _first_line(path)
            try:
                head = orjson.loads(first)
            except orjson.JSONDecodeError:
                head = None
            if head is None and b"TIMESTAMP" in first:
                fmt, block, reqs, skipped, note = "azure", DEFAULT_BLOCK_TOKENS, *_read_azure(path)
            elif isinstance(head, dict) and ("diagnose_workload" in head or "offset_s" in head):
                fmt = "diagnose"
                block, reqs, skipped, note = _read_diag(path)
            elif isinstance(head, dict) and "timestamp" in head and "input_length" in head:
                fmt, block = "mooncake", MOONCAKE_BLOCK_TOKENS
                reqs, skipped, note = _read_mooncake(path)
            else:
                raise InputError(f"{path}:{n}: not a workload file: expected diagnose's JSONL (offset_s, "
                                 "input_tokens, output_tokens), Mooncake JSONL (timestamp, input_length, "
                                 "output_length, hash_ids) or an Azure trace CSV (TIMESTAMP, ContextTokens, "
                                 "GeneratedTokens)")
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    reqs.sort(key=lambda r: r.offset_s)
    if reqs and reqs[0].offset_s:
        t0 = reqs[0].offset_s
        reqs = [_shift(r, t0) for r in reqs]
    return Replay(file=str(path), format=fmt, block_tokens=block, requests=tuple(reqs), speed=speed, loop=loop,
                  skipped=skipped, note=note)


def _shift(r: ReplayRequest, t0: float) -> ReplayRequest:
    return ReplayRequest(offset_s=r.offset_s - t0, input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                         session=r.session, turn=r.turn, prefix=r.prefix)


class _Skips:
    """Counts the records that do not fit; remembers the first (file:line: why) for the warning/error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = 0
        self.first = ""

    def add(self, line: int, why: str) -> None:
        self.n += 1
        if not self.first:
            self.first = f"{self.path}:{line}: {why}"

    def finish(self, got: int) -> str:
        if got == 0:
            raise InputError(self.first or f"{self.path}: no request in it")
        return f"{self.path}: skipped {self.n} unreadable record(s) (first: {self.first})" if self.n else ""


def _lines(path: Path) -> Iterable[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if line:
                yield n, line


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _read_diag(path: Path) -> tuple[int, list[ReplayRequest], int, str]:
    dec = msgspec.json.Decoder(_Diag)
    block = DEFAULT_BLOCK_TOKENS
    out: list[ReplayRequest] = []
    skips = _Skips(path)
    for n, line in _lines(path):
        if not out and not skips.n and b"diagnose_workload" in line:
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
        out.append(ReplayRequest(offset_s=r.offset_s, input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                                 session=None if r.session is None else str(r.session), turn=r.turn,
                                 prefix=tuple(map(str, r.prefix))))
    return block, out, skips.n, skips.finish(len(out))


def _read_mooncake(path: Path) -> tuple[list[ReplayRequest], int, str]:
    dec = msgspec.json.Decoder(_Mooncake)
    out: list[ReplayRequest] = []
    skips = _Skips(path)
    for n, line in _lines(path):
        try:
            r = dec.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            skips.add(n, _why(e))
            continue
        out.append(ReplayRequest(offset_s=r.timestamp / 1000.0, input_tokens=r.input_length,
                                 output_tokens=max(1, r.output_length), prefix=tuple(map(str, r.hash_ids))))
    return out, skips.n, skips.finish(len(out))


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _read_azure(path: Path) -> tuple[list[ReplayRequest], int, str]:
    import pandas as pd

    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path}: not a readable CSV: {_why(e)}") from None
    missing = [c for c in AZURE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{path}:1: not an Azure LLM trace CSV: missing column(s) {', '.join(missing)} "
                         f"(expected {', '.join(AZURE_COLUMNS)})")
    ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce", utc=True)
    ctx = pd.to_numeric(df["ContextTokens"], errors="coerce")
    gen = pd.to_numeric(df["GeneratedTokens"], errors="coerce")
    bad = ts.isna() | ctx.isna() | gen.isna() | (ctx < 1) | (gen < 0) | (ctx > MAX_TOKENS) | (gen > MAX_TOKENS)
    skips = _Skips(path)
    for i in bad[bad].index[:1]:
        row = df.loc[i]
        skips.add(int(i) + 2, "bad TIMESTAMP, ContextTokens or GeneratedTokens: "
                  f"{row['TIMESTAMP']!r}, {row['ContextTokens']!r}, {row['GeneratedTokens']!r}")
    skips.n = int(bad.sum())
    good = ~bad
    if not good.any():
        skips.finish(0)
    t = ts[good]
    offs = ((t - t.min()).dt.total_seconds()).to_numpy()
    out = [ReplayRequest(offset_s=float(o), input_tokens=int(c), output_tokens=max(1, int(g)))
           for o, c, g in zip(offs, ctx[good].to_numpy(), gen[good].to_numpy(), strict=True)]
    return out, skips.n, skips.finish(len(out))


# -- prefix sharing ------------------------------------------------------------------------------------------
# -- writing ----------------------------------------------------------------------------------------------
def encode_workload(reqs: Sequence[ReplayRequest], *, block_tokens: int, source: str) -> bytes:
    """The file: one header line, then one line per request (fields left out when empty)."""
    head = {"diagnose_workload": FORMAT_VERSION, "block_tokens": block_tokens, "source": source,
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
    (diagnose/observed.py)."""
    recs = bundle.records("requests") if bundle.has_stream("requests") else []
    if not recs:
        if (bundle.manifest.get("workload") or {}).get("mode") == "observe":
            return _from_observed(bundle)
        raise DiagnoseError(f"{bundle.path}: no request records to derive a workload from (the capture recorded "
                            "no request)")
    wl = bundle.manifest.get("workload") or {}
    baseline = {p.get("phase") for p in bundle.records("phases") if p.get("role") == "baseline"} \
        if bundle.has_stream("phases") else set()
    baseline |= {p.get("index") for p in wl.get("phases") or [] if isinstance(p, dict) and p.get("role") == "baseline"}
    replay = wl.get("replay") if isinstance(wl.get("replay"), dict) else None
    block = _int((replay or {}).get("block_tokens")) or DEFAULT_BLOCK_TOKENS
    load = next((s for s in bundle.meta.probes if s.name == "load"), None)
    shared_tokens = _int((load.detail if load else {}).get("shared_prefix_tokens"))
    frac = wl.get("shared_prefix_fraction")
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
    mode = wl.get("mode")
    note = ("from a concurrency run: closed-loop sends (each when a request ended) become fixed offsets"
            if mode == "concurrency" else f"from a {mode} run" if mode else "from a load run")
    return reqs, block, note


def _from_observed(bundle: Bundle) -> tuple[list[ReplayRequest], int, str]:
    """The workload of an observe-mode bundle, from the server's counters and length histograms over the
    capture, or its request spans where they cover the traffic (diagnose/observed.py), in blocks of the
    server's KV block size where it stated one."""
    from diagnose.analysis import Window
    from diagnose.normalize import otel, prometheus
    from diagnose.observed import observed_requests

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
    return reqs, block, note
