"""Capture bundle v1: a directory with manifest.json plus one JSON-lines file per evidence stream.

Writing: :class:`BundleWriter` rewrites ``manifest.json`` atomically (temp file + rename) whenever something
changes, and appends stream records line by line with a flush after each write, so an interrupted capture is
still a valid, readable bundle (marked partial). Reading: :func:`open_bundle` validates the manifest and
schema version, and reads streams tolerating a truncated last line. See docs/bundle-format.md.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from diagnose import __version__
from diagnose.errors import BundleError
from diagnose.io import schema
from diagnose.io.manifest import Artifact, Manifest, StreamEntry, read_manifest
from diagnose.model import Phase, ProbeStatus

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)
MANIFEST = "manifest.json"

# ---------------------------------------------------------------------------------------------------
MAX_LINE = 32 << 20  # a stream line longer than this is skipped and counted (never held whole in memory)
# which probe writes which stream: a stream the manifest lists but that is missing or emptied marks its probe;
# host_samples has two possible writers (py-spy with stacks, or the host probe's counters alone), and the one
# the manifest lists is the one that ran
STREAM_PROBE: dict[str, tuple[str, ...]] = {
    "requests": ("load",), "chunks": ("load",), "phases": ("load",), "client_health": ("load",),
    "metrics": ("prometheus",), "metric_families": ("prometheus",), "host_samples": ("pyspy", "host"),
    "gpu_samples": ("nvml",), "spans": ("otel",)}


def regular_file(p: Path) -> bool:
    """``p`` is a regular file (after symlinks): never a FIFO, a device or a directory, which would hang or
    mislead a reader."""
    try:
        return stat.S_ISREG(p.stat().st_mode)
    except OSError:
        return False


def open_regular(p: Path) -> io.BufferedReader:
    """``p`` opened for reading, refusing anything but a regular file without blocking (a FIFO opened
    non-blocking returns at once; fstat then says what it is). OSError / BundleError on failure."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise BundleError(f"{p}: {kind} (expected a regular file)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(p: Path, limit: int, too_big: str) -> bytes:
    """The bytes of an input file ``p`` the user named: a regular file (a FIFO or a device is refused at once,
    never read: it would hang) of at most ``limit`` bytes. InputError, one line naming ``p``, for anything else
    (``too_big``: what to say past the limit); OSError (FileNotFoundError among them) is left to the caller,
    whose message says what to give instead."""
    from diagnose.errors import InputError

    try:
        with open_regular(p) as fh:
            raw = fh.read(limit + 1)
    except BundleError as e:
        raise InputError(str(e)) from None
    if len(raw) > limit:
        raise InputError(f"{p}: {too_big}")
    return raw


def _lines(fh: io.BufferedIOBase, limit: int, block: int = 1 << 20) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line without its newline) of a binary file read in ``block``-sized pieces; a line longer
    than ``limit`` comes as (n, None) and is dropped as it is read, so memory stays bounded by ``limit`` plus
    one block whatever the file holds (a sparse file of zero bytes is one endless line)."""
    n = 0
    parts: list[bytes] = []  # the start of the current line
    plen = 0
    skipping = False  # inside an over-long line: drop everything up to its newline
    while True:
        blk = fh.read1(block)  # one read: a gzip member boundary or a corrupt block never swallows data before it
        if not blk:
            break
        k = blk.find(b"\n")
        if k < 0:
            if not skipping:
                parts.append(blk)
                plen += len(blk)
                if plen > limit:
                    parts, plen, skipping = [], 0, True
            continue
        head, rest = blk[:k], blk[k + 1:]
        n += 1
        if skipping or plen + len(head) > limit:
            yield n, None
        else:
            yield n, b"".join(parts) + head if parts else head
        parts, plen, skipping = [], 0, False
        lines = rest.split(b"\n")
        tail = lines.pop()
        for ln in lines:
            n += 1
            yield n, (None if len(ln) > limit else ln)
        if tail:
            parts, plen = [tail], len(tail)
            if plen > limit:
                parts, plen, skipping = [], 0, True
    if skipping:
        yield n + 1, None
    elif parts:
        yield n + 1, b"".join(parts)


def _inside(p: Path, root: Path) -> bool:
    """``p``, symlinks followed, lies inside ``root`` (a symlink loop counts as outside)."""
    try:
        return p.resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return False


@dataclass
class _StreamTally:
    """What one full pass over a stream file found (for the warning and the manifest comparison)."""

    good: int = 0
    undecodable: list[int] = field(default_factory=list)  # line numbers
    schema: list[tuple[int, str]] = field(default_factory=list)  # (line, why)
    overlong: list[int] = field(default_factory=list)
    ended: str = ""  # why the file ended early ("" when read to the end)


def lines_text(lines: list[int]) -> str:
    shown = ", ".join(map(str, lines[:5]))
    return f"line{'s' if len(lines) > 1 else ''} {shown}{', ...' if len(lines) > 5 else ''}"
@dataclass
class Bundle:
    """A capture bundle opened for reading.

    Every stream record is checked against its schema (diagnose/io/schema.py) as it is read; what a reader skips
    (undecodable, wrong-typed, over-long lines, a file that ends early) is counted with file and line in
    ``warnings``, once per file. :meth:`check_streams` compares what was read with the manifest's counts;
    :meth:`artifact_file` confines artifact paths to the bundle directory."""

    path: Path
    manifest: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    kind: str = "bundle"  # "bundle" (on disk) | "trace" | "spans" (a lone input adapted in memory)
    probe_problems: dict[str, str] = field(default_factory=dict)  # probe -> why its evidence is missing or broken
    _tallies: dict[str, _StreamTally] = field(default_factory=dict, repr=False)
    _noted: set[str] = field(default_factory=set, repr=False)

    @property
    def source(self) -> Path:
        """What the user gave: the bundle directory, or the trace / span file it was adapted from."""
        return self.path

    @cached_property
    def meta(self) -> Manifest:
        """The manifest, typed and schema-checked (a wrong-typed field: BundleError naming the file and field)."""
        return read_manifest(self.manifest, str(self.path / MANIFEST))

    @property
    def partial(self) -> bool:
        return not self.meta.capture.complete

    @property
    def capture_end_unix_ns(self) -> int | None:
        return self.meta.capture.ended_unix_ns

    def warn(self, message: str) -> None:
        """Adds ``message`` to ``warnings`` once (streams are read by several normalisers)."""
        if message not in self._noted:
            self._noted.add(message)
            self.warnings.append(message)

    def degrade_probe(self, probe: str, reason: str) -> None:
        """Marks ``probe`` failed with ``reason`` in :meth:`probe_statuses` (its stream or artifact is missing or
        unreadable), and says so in ``warnings``."""
        if probe not in self.probe_problems:
            self.probe_problems[probe] = reason
            self.warn(f"probe {probe} counted as failed: {reason}")

    def phases(self) -> list[Phase]:
        """The load phases (``phases`` stream), in order; a record without an integer start is skipped."""
        out = [p for rec in self.iter_records("phases") if (p := Phase.from_record(rec, self.anchor_mono_ns))]
        return sorted(out, key=lambda p: (p.start_s, p.phase))

    @property
    def anchor_unix_ns(self) -> int:
        return self.meta.capture.anchor.unix_ns

    @property
    def anchor_mono_ns(self) -> int:
        return self.meta.capture.anchor.monotonic_ns

    def probe_statuses(self) -> list[ProbeStatus]:
        out = []
        seen = set()
        for s in self.meta.probes:
            seen.add(s.name)
            why = self.probe_problems.get(s.name)
            if why and s.state in ("ok", "running"):
                s = ProbeStatus(s.name, "failed", f"{why} (recorded: {s.state}{', ' + s.reason if s.reason else ''})",
                                s.detail)
            out.append(s)
        out += [ProbeStatus(name, "failed", why) for name, why in self.probe_problems.items() if name not in seen]
        return out

    def listed_streams(self) -> Mapping[str, StreamEntry]:
        """The manifest's ``streams`` entries, by stream name."""
        return self.meta.streams

    def stream_file(self, name: str) -> Path | None:
        """The file of stream ``name``: the one the manifest names when it exists, else ``<name>.jsonl`` or
        ``<name>.jsonl.gz``; when both exist, the non-empty one (an empty ``.jsonl`` beside a full ``.jsonl.gz``
        is a leftover, said in ``warnings``). A path that is not a regular file (a FIFO, a directory) is
        never opened: a warning, and the stream counts as missing."""
        cands = [self.path / f"{name}.jsonl", self.path / f"{name}.jsonl.gz"]
        entry = self.listed_streams().get(name)
        listed = entry.file if entry is not None else None
        if listed is not None and listed in (c.name for c in cands):
            cands.sort(key=lambda c: c.name != listed)
        present = [c for c in cands if os.path.lexists(c)]
        root = self.path.resolve()
        inside = [c for c in present if _inside(c, root)]
        for c in present:
            if c not in inside:
                self.warn(f"{c}: a link that leads outside the bundle directory; stream {name} not read")
        regular = [c for c in inside if regular_file(c)]
        for c in inside:
            if c not in regular:
                self.warn(f"{c}: not a regular file (a FIFO, device or directory); stream {name} not read")
        if len(regular) > 1:
            sizes = {c: c.stat().st_size for c in regular}
            full = [c for c in regular if sizes[c] > 0] or regular
            chosen = full[0]
            others = ", ".join(c.name for c in regular if c != chosen)
            self.warn(f"{self.path}: stream {name} has two files; read {chosen.name}, ignored {others}"
                      + (" (empty)" if all(sizes[c] == 0 for c in regular if c != chosen) else ""))
            return chosen
        return regular[0] if regular else None

    def has_stream(self, name: str) -> bool:
        return self.stream_file(name) is not None

    def iter_records(self, name: str) -> Iterator[dict[str, Any]]:
        """Records of one stream that match its schema (diagnose/io/schema.py). A truncated, undecodable,
        over-long or wrong-typed line is skipped; a compressed file that ends early or is corrupt keeps the
        records before the damage; each is counted with its file and line in ``warnings``."""
        for _n, rec in self.iter_numbered(name):
            yield rec

    def iter_numbered(self, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, record) for :meth:`iter_records`' records (a normaliser that checks more names the
        line)."""
        p = self.stream_file(name)
        if p is None:
            return
        t = _StreamTally()
        try:
            with open_regular(p) as raw_fh:
                fh = gzip.GzipFile(fileobj=raw_fh, mode="rb") if p.name.endswith(".gz") else raw_fh
                for n, raw in _lines(fh, MAX_LINE, 64 << 10 if p.name.endswith(".gz") else 1 << 20):
                    if raw is None:
                        t.overlong.append(n)
                        continue
                    line = raw.strip()
                    if not line:
                        continue
                    try:
                        rec = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        t.undecodable.append(n)
                        continue
                    if not isinstance(rec, dict):
                        t.undecodable.append(n)
                        continue
                    why = schema.check(name, rec)
                    if why is not None:
                        t.schema.append((n, why))
                        continue
                    t.good += 1
                    yield n, rec
        except (OSError, EOFError, zlib.error, BundleError) as e:
            t.ended = str(getattr(e, "strerror", None) or e)
        self._tallies[name] = t
        self._note_tally(p, t)

    def _note_tally(self, p: Path, t: _StreamTally) -> None:
        if t.ended:
            self.warn(f"{p}: stream ends early ({t.ended}); the {t.good} record(s) before that point were kept")
        if t.undecodable:
            self.warn(f"{p}: skipped {len(t.undecodable)} unreadable line(s) (truncated or corrupt JSON, or not an "
                      f"object): {lines_text(t.undecodable)}")
        if t.overlong:
            self.warn(f"{p}: skipped {len(t.overlong)} line(s) too long to be a record (over {MAX_LINE >> 20} MiB): "
                      f"{lines_text(t.overlong)}")
        if t.schema:
            first_line, why = t.schema[0]
            self.warn(f"{p}: skipped {len(t.schema)} record(s) that do not match the schema: "
                      f"{lines_text([n for n, _ in t.schema])} (line {first_line}: {why})")

    def records(self, name: str) -> list[dict[str, Any]]:
        return list(self.iter_records(name))

    def check_streams(self) -> None:
        """Compares the manifest's record counts with what was read: a listed stream that is missing, or that
        gave fewer records than the manifest counts, is a warning, and a missing or empty one marks the probe
        that wrote it as failed."""
        for name, entry in sorted(self.listed_streams().items()):
            n = entry.records
            p = self.stream_file(name)
            writers = STREAM_PROBE.get(name, ())
            ran = {s.name for s in self.meta.probes}
            probe = next((w for w in writers if w in ran), writers[0] if writers else None)
            if p is None:
                what = f"stream {name} is listed in the manifest" + (f" with {n} records" if n else "")
                self.warn(f"{self.path}: {what} but its file is missing or unreadable")
                if probe and n != 0:
                    self.degrade_probe(probe, f"stream {name} missing")
                continue
            if name not in self._tallies:
                for _ in self.iter_records(name):
                    pass
            got = self._tallies[name].good
            if n is not None and got < n:
                self.warn(f"{p}: read {got} of the {n} records the manifest counts")
                if got == 0 and probe:
                    self.degrade_probe(probe, f"stream {name} holds no readable record (manifest: {n})")

    def artifact_file(self, name: str, entry: Artifact) -> Path | None:
        """The file of artifact ``name``, confined to the bundle directory: an absolute path, a path with
        ``..`` or a symlink that leads outside the bundle is refused (a warning, never opened), as is a path
        that is missing or not a regular file."""
        rel = entry.file or f"artifacts/{name}"
        root = self.path.resolve()
        cand = Path(rel)
        try:
            real = (root / cand).resolve()
        except (OSError, RuntimeError):
            real = None
        if cand.is_absolute() or real is None or not real.is_relative_to(root):
            self.warn(f"artifact {name}: its path leads outside the bundle directory; not read")
            return None
        if not real.exists():
            self.warn(f"artifact {name}: {self.path / rel} is missing")
            return None
        if not regular_file(real):
            self.warn(f"artifact {name}: {self.path / rel} is not a regular file; not read")
            return None
        return real


@dataclass
class MemoryBundle(Bundle):
    """A bundle held in memory, adapted from a lone input (a profiler trace or an OTLP span file), so every
    input goes through the same pipeline. Its streams live in ``streams``; its artifacts are the given files."""

    streams: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    given: Path | None = None

    @property
    def source(self) -> Path:
        return self.given or self.path

    @property
    def partial(self) -> bool:
        return False

    def stream_file(self, name: str) -> Path | None:
        return None

    def has_stream(self, name: str) -> bool:
        return bool(self.streams.get(name))

    def check_streams(self) -> None:
        return None

    def iter_numbered(self, name: str) -> Iterator[tuple[int, dict[str, Any]]]:
        bad: list[tuple[int, str]] = []
        for n, rec in enumerate(self.streams.get(name, ()), 1):
            why = schema.check(name, rec) if isinstance(rec, dict) else "not an object"
            if why is None:
                yield n, rec
            else:
                bad.append((n, why))
        if bad:
            self.warn(f"{self.source}: skipped {len(bad)} {name} record(s) that do not match the schema: "
                      f"{lines_text([n for n, _ in bad]).replace('line', 'record')} (record {bad[0][0]}: {bad[0][1]})")


def open_bundle(path: str | Path) -> Bundle:
    p = Path(path)
    if not p.exists():
        raise BundleError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise BundleError(f"{p} is not a capture bundle (a bundle is a directory with manifest.json)")
    mf = p / MANIFEST
    if not os.path.lexists(mf):
        raise BundleError(f"{p} is not a capture bundle: it has no {MANIFEST}")
    try:
        with open_regular(mf) as fh:
            manifest = orjson.loads(fh.read(MAX_LINE + 1))
    except orjson.JSONDecodeError as e:
        raise BundleError(f"{mf}: not valid JSON ({e})") from e
    except OSError as e:
        raise BundleError(f"{mf}: cannot read ({e.strerror or e})") from e
    if not isinstance(manifest, dict):
        raise BundleError(f"{mf}: expected a JSON object")
    ver = manifest.get("schema_version")  # raw: the version decides whether the typed reader may run at all
    if ver not in SUPPORTED_SCHEMA_VERSIONS or isinstance(ver, bool):
        raise BundleError(
            f"{mf}: unknown schema_version {ver!r}; this diagnose {__version__} reads "
            f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}"
        )
    b = Bundle(path=p, manifest=manifest)
    b.meta  # noqa: B018 - the schema check, here: a bad manifest is one line before any analysis starts
    if not b.meta.capture.anchored:
        b.warn(f"{mf}: capture.clock_anchor is missing; times are read on the probes' own clock (no wall-clock "
               "mapping for traces or spans)")
    if b.partial:
        why = b.meta.capture.interrupted or "capture did not finish (no end recorded)"
        b.warnings.append(f"partial capture: {why}")
    return b
