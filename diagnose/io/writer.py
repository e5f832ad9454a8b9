"""writer: split out of diagnose.io.bundle."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import orjson

from diagnose import __version__
from diagnose.capture.redact import Redactor
from diagnose.errors import BundleError
from diagnose.io import schemas
from diagnose.io.bundle import MANIFEST, SCHEMA_VERSION
from diagnose.model import ProbeStatus


def utc_iso(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")


class HostInfo(TypedDict):
    """The manifest's ``host``: where the capture ran (``memory_total_bytes`` when psutil could tell)."""

    hostname: str
    platform: str
    python: str
    cpu_count: int | None
    memory_total_bytes: NotRequired[int]


def host_info() -> HostInfo:
    info: HostInfo = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import psutil

        info["memory_total_bytes"] = int(psutil.virtual_memory().total)
    except Exception:  # pragma: no cover - psutil is a dependency, but host info is best effort
        pass
    return info


def serialize_records(records: Sequence[Mapping[str, object]]) -> bytes:
    """JSON lines of ``records``, as a stream file holds them."""
    return b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in records)


RESERVE_BYTES = 1 << 20  # kept free for the final manifest write (disk full: issue 12, defect 3)
RESERVE = ".diagnose-reserve"  # the preallocated file that holds that space; removed when the bundle is finished
FILE_MODE_PRIVATE = 0o600  # a bundle that holds prompt or output text (--store-text): owner only
DIR_MODE_PRIVATE = 0o700


def _write_error(path: Path, e: OSError) -> str:
    return f"cannot write {path}: {e.strerror or e}"


class StreamWriter:
    """Appends JSON records to one stream file, one per line, written through after every write.

    A write that fails (disk full, I/O error) is undone to the last whole record, so the file holds every
    record that fit and no torn line; the writer then drops whatever comes after and reports the failure
    once to ``on_error`` (the bundle's, which stops the capture). It never raises for a write error."""

    def __init__(self, path: Path, lock: threading.Lock, *, mode: int = 0o666,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.path = path
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
            self._size = os.fstat(self._fd).st_size
        except OSError as e:
            self._fd = None
            self._size = 0
            self.error: str | None = _write_error(path, e)
            if on_error is not None:
                on_error(self.error)
        else:
            self.error = None
        self._lock = lock
        self._on_error = on_error
        self.records = 0

    def write(self, record: Mapping[str, object]) -> None:
        self.write_serialized(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n", 1)

    def write_many(self, records: Sequence[Mapping[str, object]]) -> None:
        if records:
            self.write_serialized(serialize_records(records), len(records))

    def write_serialized(self, data: bytes, n: int) -> None:
        """Appends ``n`` records already turned into lines by :func:`serialize_records` (lets a caller
        serialise on its own thread and leave only the file write to another)."""
        with self._lock:
            if self._fd is None:
                return
            view = memoryview(data)
            try:
                while view:
                    k = os.write(self._fd, view)
                    view = view[k:]
            except OSError as e:
                self._fail(e)
                return
            self._size += len(data)
            self.records += n

    def _fail(self, e: OSError) -> None:
        fd, self._fd = self._fd, None
        self.error = _write_error(self.path, e)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)  # back to the last whole record: no torn line
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._on_error is not None:
            self._on_error(self.error)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


class BundleWriter:
    """Creates a bundle directory and keeps its manifest current while probes write their streams.

    Everything written goes through one :class:`~diagnose.capture.redact.Redactor` (``redactor``): the manifest is
    redacted as a whole on every write; probes redact free text they take from the server (the load probe's
    error details) before it reaches a stream. ``private`` (the bundle holds prompt or output text) makes the
    directory 0700 and every file 0600.

    A write error during the capture (disk full) never raises out of a probe's bookkeeping: the first one is
    kept in ``write_error`` and passed to ``on_write_error`` (the capture stops then), later ones are dropped.
    Space for the final manifest is held in reserve from the start (a preallocated file, released just
    before the final write), so even a full disk ends with a manifest that says the capture failed and why.
    """

    def __init__(self, path: str | Path, *, target: Mapping[str, object] | None = None,
                 workload: Mapping[str, object] | None = None, options: Mapping[str, object] | None = None,
                 overwrite: bool = False, redactor: Redactor | None = None, private: bool = False,
                 keep: bool = False) -> None:
        self.path = Path(path)
        # keep: the folder may already hold files, which stay (diagnose readiness: its launched server's log is
        # written before the bundle starts, and --force writes into a folder that is not empty)
        if not keep and self.path.exists() and any(self.path.iterdir()):
            if not overwrite:
                raise BundleError(f"output directory {self.path} exists and is not empty (use --force to replace it)")
            shutil.rmtree(self.path)
        self.private = private
        self.redactor = redactor or Redactor()
        self.write_error: str | None = None
        self.on_write_error: Callable[[str], None] | None = None
        dmode = DIR_MODE_PRIVATE if private else 0o777
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=dmode)
            (self.path / "artifacts").mkdir(exist_ok=True, mode=dmode)
            if private:  # mkdir's mode is masked by the umask and leaves an existing directory as it was
                os.chmod(self.path, DIR_MODE_PRIVATE)
                os.chmod(self.path / "artifacts", DIR_MODE_PRIVATE)
        except OSError as e:
            raise BundleError(f"cannot create bundle directory {self.path}: {e.strerror or e}") from e
        self._file_mode = FILE_MODE_PRIVATE if private else 0o666
        self._lock = threading.RLock()
        self._streams: dict[str, StreamWriter] = {}
        unix_ns = time.time_ns()
        mono_ns = time.monotonic_ns()
        self.anchor_unix_ns = unix_ns
        self.anchor_mono_ns = mono_ns
        self.manifest: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "diagnose", "version": __version__},
            "capture": {
                "started_at": utc_iso(unix_ns),
                "started_unix_ns": unix_ns,
                "ended_at": None,
                "ended_unix_ns": None,
                "clock_anchor": {"unix_ns": unix_ns, "monotonic_ns": mono_ns},
                "complete": False,
                "interrupted": None,
            },
            "target": dict(target or {}),
            "host": host_info(),
            "workload": dict(workload or {}),
            "options": dict(options or {}),
            "probes": {},
            "streams": {},
            "artifacts": {},
        }
        self._write_manifest()  # raises: a bundle that cannot be started is an error before any capture
        self._reserve()

    # -- time --------------------------------------------------------------------------------------
    def mono_to_rel_s(self, mono_ns: int) -> float:
        """Seconds since the capture started, from a CLOCK_MONOTONIC timestamp in ns."""
        return (mono_ns - self.anchor_mono_ns) / 1e9

    def unix_to_rel_s(self, unix_ns: int) -> float:
        return (unix_ns - self.anchor_unix_ns) / 1e9

    # -- write errors ------------------------------------------------------------------------------
    def _reserve(self) -> None:
        p = self.path / RESERVE
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self._file_mode)
            try:
                try:
                    os.posix_fallocate(fd, 0, RESERVE_BYTES)
                except (AttributeError, OSError):  # no fallocate here (or the fs lacks it): real zeros
                    os.write(fd, bytes(RESERVE_BYTES))
            finally:
                os.close(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                p.unlink()
            raise BundleError(f"cannot write {self.path}: {e.strerror or e} (no room for the bundle)") from e

    def _release_reserve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / RESERVE).unlink()

    def note_write_error(self, msg: str) -> None:
        """The first write error of the capture: kept, and passed on to ``on_write_error`` (once)."""
        with self._lock:
            if self.write_error is not None:
                return
            self.write_error = msg
            cb = self.on_write_error
        if cb is not None:
            cb(msg)

    # -- manifest ----------------------------------------------------------------------------------
    def _write_manifest(self) -> None:
        """Writes the manifest (atomically: temp file, fsync, rename); raises BundleError naming the file.
        A failed write leaves no temp file behind."""
        with self._lock:
            for name, sw in self._streams.items():
                self.manifest["streams"][name]["records"] = sw.records
            data = schemas.dumps(self.redactor.value(self.manifest),  # schema_version first, then sorted
                                 orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
            tmp = self.path / (MANIFEST + ".tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self._file_mode)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path / MANIFEST)
            except OSError as e:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise BundleError(_write_error(self.path / MANIFEST, e)) from e

    def write_manifest(self) -> None:
        """The manifest as it stands, during the capture: a write error is noted (``write_error``), not
        raised, so that a probe's bookkeeping (a status, a new stream) never fails because the disk did;
        the final write (:meth:`finish`) uses the reserve and raises if even that fails."""
        try:
            self._write_manifest()
        except BundleError as e:
            self.note_write_error(str(e))

    def update(self, section: str, values: Mapping[str, object]) -> None:
        with self._lock:
            self.manifest.setdefault(section, {}).update(values)
            self.write_manifest()

    def set_probe_status(self, status: ProbeStatus) -> None:
        with self._lock:
            self.manifest["probes"][status.name] = status.to_json()
            self.write_manifest()

    # -- streams and artifacts ---------------------------------------------------------------------
    def stream(self, name: str, description: str = "") -> StreamWriter:
        """The writer for stream ``name`` (file ``<name>.jsonl``), created on first use."""
        with self._lock:
            sw = self._streams.get(name)
            if sw is None:
                # a lock per stream: a slow write to one stream (the load probe writes its chunk records
                # from an I/O thread) never holds up a writer of another
                sw = StreamWriter(self.path / f"{name}.jsonl", threading.Lock(), mode=self._file_mode,
                                  on_error=self.note_write_error)
                self._streams[name] = sw
                self.manifest["streams"][name] = {"file": f"{name}.jsonl", "description": description, "records": 0}
                self.write_manifest()
            return sw

    def artifact_path(self, name: str) -> Path:
        return self.path / "artifacts" / name

    def add_artifact(self, name: str, kind: str, description: str = "", **extra: Any) -> None:
        with self._lock:
            p = self.artifact_path(name)
            entry = {"file": f"artifacts/{name}", "kind": kind, "description": description,
                     "bytes": p.stat().st_size if p.exists() else None}
            entry.update(extra)
            self.manifest["artifacts"][name] = entry
            self.write_manifest()

    def finish(self, *, interrupted: str | None = None) -> None:
        """The final manifest: the end time, and whether the capture is complete; a write error during the
        capture marks it failed with the reason (``capture.interrupted``, ``capture.error``). The reserve is
        released just before, so this write fits on a disk the capture filled. Raises BundleError (naming the
        file) only if even that fails."""
        with self._lock:
            for sw in self._streams.values():
                sw.close()
            now = time.time_ns()
            cap = self.manifest["capture"]
            cap["ended_unix_ns"] = now
            cap["ended_at"] = utc_iso(now)
            if self.write_error is not None:
                cap["error"] = self.write_error
                interrupted = f"capture failed: {self.write_error}" + (f" ({interrupted})" if interrupted else "")
            cap["interrupted"] = interrupted
            cap["complete"] = interrupted is None
            self._release_reserve()
            self._write_manifest()
            if self.private:
                for p in self.path.rglob("*"):
                    with contextlib.suppress(OSError):
                        os.chmod(p, DIR_MODE_PRIVATE if p.is_dir() else FILE_MODE_PRIVATE)


