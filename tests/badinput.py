"""Building bad inputs for the hardening tests (tests/test_hardening_read.py, tests/test_fuzz_read.py), and the
one contract every case is checked against (:func:`check_contract`).

A case copies a shipped sample bundle (sample_traces/) into a temporary directory, damages it, and runs
``diagnose analyze`` in-process through click's CliRunner. The contract, for every case:

* no Python traceback and no "internal error" in the output;
* either a non-zero exit (1 or 2) whose last stderr line is one line ``diagnose: error: ...`` naming the file
  (and, where the case says so, the line or field), or a finished analysis (exit 0, 4 or 5) that, when the case
  damaged something the reader can notice, prints at least one ``warning:`` line.
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner, Result

from diagnose.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"
SAMPLE_NAMES = sorted(p.name for p in SAMPLES.iterdir() if (p / "bundle" / "manifest.json").is_file())
STREAMS = ("requests", "chunks", "phases", "client_health", "metrics", "metric_families", "host_samples",
           "gpu_samples")

ERROR_CODES = (1, 2)
RESULT_CODES = (0, 4, 5)


# A small copy of each sample (the first records of each stream, manifest counts to match), so that one case
# analyses in a fraction of a second: hundreds of cases fit the unit suite's time.
KEEP = {"requests": 24, "chunks": 24, "client_health": 40, "metrics": 8, "gpu_samples": 40}
KEEP_KIND = {"thread_cpu": 40, "stack": 30, "system_cpu": 8, "dump": 4, "foreign_cpu": 20, "foreign_scan": 4}
_MINI: dict[str, Path] = {}


def mini_sample(name: str) -> Path:
    """The small copy of sample ``name``'s bundle (built once per process in a temporary directory)."""
    if name in _MINI:
        return _MINI[name]
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="diagnose-mini-"))
    dst = root / name
    shutil.copytree(SAMPLES / name / "bundle", dst)
    m = read_manifest(dst)
    rids: set[Any] = set()
    for stream in ("requests", *[s for s in STREAMS if s != "requests"]):
        recs = read_stream(dst, stream)
        if not recs:
            continue
        if stream == "requests":
            measured = [r for r in recs if not r.get("warmup")]
            step = max(1, len(measured) // KEEP["requests"])  # spread over the run: every phase keeps some
            recs = [r for r in recs if r.get("warmup")][:4] + measured[::step][:KEEP["requests"]]
            rids = {r["rid"] for r in recs}
        elif stream == "chunks":
            recs = [r for r in recs if r.get("rid") in rids]
        elif stream == "host_samples":
            seen: dict[str, int] = {}
            kept = []
            for r in recs:
                k = str(r.get("kind"))
                seen[k] = seen.get(k, 0) + 1
                if seen[k] <= KEEP_KIND.get(k, 10**9):
                    kept.append(r)
            recs = kept
        elif stream in KEEP:
            recs = recs[:KEEP[stream]]
        write_stream(dst, stream, recs)
        if stream in m.get("streams", {}):
            m["streams"][stream]["records"] = len(recs)
    (dst / "manifest.json").write_bytes(dumps(m))
    _MINI[name] = dst
    return dst


LOAD_STREAMS = ("requests", "chunks", "phases", "client_health")


def copy_sample(name: str, dst: Path, *, full: bool = False, keep: Sequence[str] | None = None) -> Path:
    """A writable copy of sample ``name``'s bundle at ``dst`` (its small copy unless ``full``); with ``keep``,
    only those streams (and the manifest lists only them), so that a case pays only for what it damages."""
    shutil.copytree(SAMPLES / name / "bundle" if full else mini_sample(name), dst)
    if keep is not None:
        m = read_manifest(dst)
        for s in STREAMS:
            p = stream_path(dst, s)
            if p is not None and s not in keep:
                p.unlink()
                (m.get("streams") or {}).pop(s, None)
        (dst / "manifest.json").write_bytes(dumps(m))
    return dst


def stream_path(bundle: Path, name: str) -> Path | None:
    for cand in (f"{name}.jsonl.gz", f"{name}.jsonl"):
        if (bundle / cand).exists():
            return bundle / cand
    return None


def read_stream(bundle: Path, name: str) -> list[dict[str, Any]]:
    p = stream_path(bundle, name)
    if p is None:
        return []
    data = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def dumps(obj: Any) -> bytes:
    """JSON of ``obj``; integers beyond 64 bits (which orjson refuses) through the standard library."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        import json

        return json.dumps(obj).encode()


def write_stream(bundle: Path, name: str, records: Sequence[Any], *, raw: bytes | None = None) -> Path:
    """Replaces stream ``name`` with ``records`` (or the bytes ``raw``), keeping its compression."""
    p = stream_path(bundle, name) or bundle / f"{name}.jsonl"
    data = raw if raw is not None else b"".join(dumps(r) + b"\n" for r in records)
    p.write_bytes(gzip.compress(data) if p.name.endswith(".gz") else data)
    return p


def edit_records(bundle: Path, name: str, fn: Callable[[list[dict[str, Any]]], None]) -> Path:
    recs = read_stream(bundle, name)
    fn(recs)
    return write_stream(bundle, name, recs)


def read_manifest(bundle: Path) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads((bundle / "manifest.json").read_bytes())
    return out


def edit_manifest(bundle: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    m = read_manifest(bundle)
    fn(m)
    (bundle / "manifest.json").write_bytes(dumps(m))


def analyze(args: Sequence[str | Path], out_dir: Path) -> Result:
    """``diagnose analyze ARGS -o out_dir/report.html --json out_dir/findings.json`` in-process."""
    argv = ["analyze", *map(str, args), "-o", str(out_dir / "report.html"), "--json", str(out_dir / "findings.json")]
    return CliRunner().invoke(cli, argv, catch_exceptions=True)


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    warnings: list[str]

    @property
    def error_line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def outcome(res: Result) -> Outcome:
    err = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        err += "".join(traceback.format_exception(res.exception))
    return Outcome(code=res.exit_code, stdout=res.stdout, stderr=err,
                   warnings=[ln for ln in err.splitlines() if ln.startswith("warning:")])


def check_contract(o: Outcome, *, names: Sequence[str] = (), expect: str = "any", needle: str = "") -> str:
    """'' when ``o`` keeps the contract (module docstring), else what is wrong.

    ``names``: the message must name one of these (file names); ``expect``: "error" (must be unusable),
    "warn" (must be usable with a warning, or an error), "result" (must finish), "any" (either, no warning
    required); ``needle``: a text the error line or a warning must contain (a field, a line number)."""
    text = o.stdout + o.stderr
    if "Traceback" in text:
        return "traceback"
    if "internal error" in text:
        return "internal error: " + o.error_line
    if o.code in ERROR_CODES:
        line = o.error_line
        if not line.startswith("diagnose: error: "):
            return f"exit {o.code} without a one-line error: {line!r}"
        if "\n" in line.strip():
            return "multi-line error"
        if names and not any(n in line for n in names):
            return f"error does not name {list(names)}: {line!r}"
        if needle and needle not in line:
            return f"error lacks {needle!r}: {line!r}"
        if expect == "result":
            return f"expected a result, got: {line!r}"
        return ""
    if o.code not in RESULT_CODES:
        return f"unexpected exit {o.code}: {o.error_line!r}"
    if expect == "error":
        return f"expected an error, got exit {o.code} ({o.stdout.splitlines()[:1]})"
    if expect == "warn":
        if not o.warnings:
            return f"expected a warning, got none (exit {o.code}, {o.stdout.splitlines()[:1]})"
        if names and not any(n in w for w in o.warnings for n in names):
            return f"no warning names {list(names)}: {o.warnings[:3]}"
        if needle and not any(needle in w for w in o.warnings):
            return f"no warning contains {needle!r}: {o.warnings[:3]}"
    return ""
