"""Parse Prometheus scrapes in a child process, so parsing never holds the capturing process's GIL.

prometheus_client's parser is pure Python: tens of ms per vLLM scrape here. In a thread it holds the GIL
in 5 ms slices, delaying the load generator's event loop (and so its token timestamps) in the same
process; benchmarks/results/prometheus_probe_cost.md measures it. :class:`ParseWorker` starts
``python -m diagnose.probes.prometheus_worker`` once per capture and exchanges one length-prefixed text and
one JSON line per scrape over pipes. If the child cannot start or dies, the probe falls back to a thread.

Protocol (stdin): a JSON header line ``{"n": <bytes>, "keep_all": bool, "cpu_s": <budget>}`` then ``n``
bytes of UTF-8 text. (stdout): one JSON line ``{"samples": [...], "families": [...], "cpu_ms": <float>}`` or
``{"error": category, "message": str}``, each with ``work_cpu_ms`` (the child's CPU for the whole request:
reading, decoding and parsing; what the probe counts as its cost).

The cost limit is CPU time, not wall time: the child runs at normal priority beside an engine that may
saturate every core, so a parse that needs 40 ms of CPU can wait seconds for it, and that wait costs the
engine nothing. A profiling timer (``ITIMER_PROF``, the child's own user + system CPU) ends a parse that
has used ``cpu_s`` of CPU: category ``parse_timeout``, on which the probe stops scraping.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import tempfile
import time
from typing import Any, TypedDict

import orjson
from prometheus_client.parser import text_string_to_metric_families

from diagnose.capture.realtime import child_argv
from diagnose.engines.detect import is_engine_relevant

MODULE = "diagnose.probes.prometheus_worker"


class ScrapeError(Exception):
    """One scrape failed; ``category`` is one of refused, connect, timeout, http_<status>, not_prometheus."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


def prefilter(text: str) -> str:
    """Keep only the lines (samples and their # HELP / # TYPE) of engine-relevant metrics."""
    out: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and not is_engine_relevant(parts[2]):
                continue
        else:
            brace = line.find("{")
            name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
            if not is_engine_relevant(name):
                continue
        out.append(line)
    out.append("")
    return "\n".join(out)


def parse_scrape(text: str, keep_all: bool = False) -> tuple[list[list[Any]], list[dict[str, str]]]:
    """Prometheus text -> (samples as [name, labels, value], families as {name, type, help}).

    Raises ScrapeError("not_prometheus") when the text does not parse."""
    body = text if keep_all else prefilter(text)
    samples: list[list[Any]] = []
    families: list[dict[str, str]] = []
    try:
        for fam in text_string_to_metric_families(body):
            families.append({"name": fam.name, "type": fam.type, "help": fam.documentation})
            for s in fam.samples:
                if s.name.endswith("_created") and not keep_all:
                    continue
                v = float(s.value)
                samples.append([s.name, dict(s.labels), v if math.isfinite(v) else None])
        if not samples and body is not text:
            # nothing engine-relevant: make sure the unfiltered body is Prometheus text at all
            for _ in text_string_to_metric_families(text):
                pass
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise ScrapeError("not_prometheus", f"response is not Prometheus text format ({e})") from e
    return samples, families




class _OverBudget(BaseException):
    """Raised by the profiling timer inside a parse (a BaseException: no parser ``except`` catches it)."""


def _over_budget(signum: int, frame: object) -> None:
    raise _OverBudget


class ParseAnswer(TypedDict, total=False):
    """What the worker sends back for one scrape: the samples and families and the CPU the parse used, or an
    error (category and message); ``work_cpu_ms``: the CPU of the whole request, reading and decoding too."""

    samples: list[list[Any]]
    families: list[dict[str, str]]
    cpu_ms: float
    error: str
    message: str
    work_cpu_ms: float


def parse_within_cpu(text: str, keep_all: bool, cpu_s: float) -> ParseAnswer:
    """One parse in this process's main thread, ended once it has used ``cpu_s`` of CPU; the answer the
    worker sends back (with ``cpu_ms``, the CPU the parse used)."""
    c0 = time.process_time()
    old = signal.signal(signal.SIGPROF, _over_budget)
    signal.setitimer(signal.ITIMER_PROF, max(cpu_s, 1e-3))
    try:
        samples, families = parse_scrape(text, keep_all)
    except _OverBudget:
        return {"error": "parse_timeout", "message": f"parsing a {len(text)}-byte scrape used over {cpu_s:g} s "
                                                     "of CPU"}
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
    return {"samples": samples, "families": families, "cpu_ms": (time.process_time() - c0) * 1e3}


class WorkerGone(Exception):
    """The child process is not (or no longer) usable."""


class ParseWorker:
    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._ready: asyncio.Task[bytes] | None = None
        # the child's stderr, to say why it did not start (a file: a pipe nobody reads could fill and block it)
        self._stderr: Any = None

    @property
    def ready(self) -> bool:
        """The child has imported its modules and waits for work (until then the probe parses in a thread)."""
        return (self._ready is not None and self._ready.done() and not self._ready.cancelled()
                and self._ready.exception() is None and self._ready.result() == b"ready\n")

    @property
    def failed(self) -> bool:
        return self._ready is not None and self._ready.done() and not self.ready

    async def start(self) -> None:
        try:
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - open for the child's life, closed by close()
            self._proc = await asyncio.create_subprocess_exec(
                *child_argv([sys.executable, "-m", MODULE]), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=self._stderr, limit=1 << 26)
        except OSError as e:
            self._close_stderr()
            raise WorkerGone(f"cannot start the parse worker: {e}") from e
        assert self._proc.stdout is not None
        self._ready = asyncio.ensure_future(self._proc.stdout.readline())

    async def why_not_started(self) -> str:
        """Why the child did not say it was ready, in a few words: what it answered, its exit status and the last
        line it wrote to stderr (a failed import, a signal). Waits up to a second for a child that closed its
        stdout to exit."""
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 1.0)
        parts: list[str] = []
        if self._ready is not None and self._ready.done():
            if self._ready.cancelled():
                parts.append("stopped before it was ready")
            elif self._ready.exception() is not None:
                parts.append(f"{type(self._ready.exception()).__name__}")
            elif self._ready.result():
                parts.append(f"answered {self._ready.result()[:60]!r}")
        if self._proc is not None and self._proc.returncode is not None:
            parts.append(f"exit status {self._proc.returncode}")
        if self._stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                self._stderr.seek(0, os.SEEK_END)
                self._stderr.seek(max(0, self._stderr.tell() - 2048))
                lines = [ln for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
                if lines:
                    parts.append(lines[-1].strip()[:200])
        return "; ".join(parts) or "no answer"

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()
            self._stderr = None

    async def parse(self, text: str, keep_all: bool, cpu_s: float) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None or proc.returncode is not None:
            raise WorkerGone("parse worker not running")
        data = text.encode("utf-8")
        try:
            proc.stdin.write(orjson.dumps({"n": len(data), "keep_all": keep_all, "cpu_s": cpu_s}) + b"\n" + data)
            await proc.stdin.drain()
            line = await proc.stdout.readline()
        except (OSError, ValueError, asyncio.LimitOverrunError) as e:
            raise WorkerGone(f"parse worker pipe broke: {e}") from e
        if not line:
            raise WorkerGone(f"parse worker exited (status {proc.returncode})")
        out = orjson.loads(line)
        if not isinstance(out, dict):
            raise WorkerGone("parse worker answered garbage")
        return out

    async def close(self, kill: bool = False) -> None:
        """Ends the child: stdin closed (it exits when idle), or ``kill`` (stuck in a parse)."""
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
        proc, self._proc = self._proc, None
        if proc is None:
            self._close_stderr()
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 2.0)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        finally:
            self._close_stderr()


def main() -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(b"ready\n")
    stdout.flush()
    while True:
        header = stdin.readline()
        if not header:
            return 0
        c0 = time.process_time()
        try:
            h = orjson.loads(header)
            text = stdin.read(int(h["n"])).decode("utf-8")
            out = parse_within_cpu(text, bool(h.get("keep_all")), float(h.get("cpu_s", 5.0)))
        except ScrapeError as e:
            out = {"error": e.category, "message": str(e)}
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            out = {"error": "not_prometheus", "message": f"bad request to the parse worker: {e}"}
        out["work_cpu_ms"] = (time.process_time() - c0) * 1e3  # reading and decoding the text too (probe cost)
        stdout.write(orjson.dumps(out) + b"\n")
        stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
