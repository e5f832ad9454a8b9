"""pyinstrument: profile the load client itself (``attach --profile-client``), or a Python server started
under diagnose (``diagnose run -o BUNDLE -- python server.py ...``), whose main thread runs its event loop.

Client (probe ``pyinstrument``): profiles the thread running the capture's event loop (the load generator
and every asyncio probe) from start to ``ctx.stop``. Writes ``artifacts/pyinstrument_client.html`` (the
interactive pyinstrument view), ``artifacts/pyinstrument_client.pyisession`` (re-renderable with
``pyinstrument --load``) and stream ``client_profile``: one ``{kind: "summary", who, duration_s, busy_ratio,
idle_ratio, top: [{function, file, self_s}]}`` record. ``busy_ratio`` is the share of wall time the loop
thread spent outside its idle wait (selector ``select``/``epoll``; under uvloop, the native code below
``asyncio.Runner.run``, where uvloop waits): near 1 means the client was saturated
and its timings are suspect; low means the client was not the bottleneck.

Server: :func:`run_under_profiler` runs the command with a small bootstrap that starts pyinstrument on the
main thread, runs the script or module, and saves the same files (``pyinstrument_server.*``) when the
server exits (SIGINT/SIGTERM are forwarded; the profile is written on the way out). The server's own
interpreter needs pyinstrument installed.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

import orjson

from diagnose.errors import InputError
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec

NAME = "pyinstrument"
IDLE_FUNCS = re.compile(r"^(select|poll|epoll|_run_once|run_forever|sleep|wait|kqueue|control)$")
# the loop's driver frames: under uvloop (the loop attach runs) the wait for I/O happens in native code that
# pyinstrument does not see, so it lands as self time of the last Python frame above it, asyncio's Runner.run
# (or uvloop.run): idle too, with uvloop's own bookkeeping between callbacks (small next to the wait)
LOOP_DRIVERS = re.compile(r"^(run|run_until_complete|run_forever)$")
LOOP_FILES = re.compile(r"(^|[/\\])(asyncio|uvloop)[/\\]")
_SECRET_FLAGS = re.compile(r"(key|token|secret|password)", re.I)


class TopFunction(TypedDict):
    function: str
    file: str
    self_s: float


class ProfileSummary(TypedDict):
    """The ``client_profile`` stream's record: a profiled loop's busy/idle split and its top self-time functions."""

    kind: str  # "summary"
    who: str  # "client" (attach --profile-client) or "server" (a profiled server process)
    duration_s: float
    busy_ratio: float
    idle_ratio: float
    top: list[TopFunction]


def summarize(session: Any, who: str, top_n: int = 15) -> ProfileSummary:
    """Busy/idle split and top self-time functions of a pyinstrument Session (plain data)."""
    root = session.root_frame()
    duration = float(session.duration or 0.0)
    self_time: dict[tuple[str, str], float] = {}
    idle = 0.0
    stack = [root] if root is not None else []
    while stack:
        f = stack.pop()
        stack.extend(f.children)
        if f.identifier == "[self]" or f.function == "[self]":
            continue  # synthetic self-time child: counted in its parent below
        own = float(f.time) - sum(float(c.time) for c in f.children if c.function != "[self]")
        if own <= 1e-9:
            continue
        fn = str(f.function or "")
        path = str(f.file_path_short or f.file_path or "")
        name = fn.rsplit(".", 1)[-1]
        if IDLE_FUNCS.match(name) or (LOOP_DRIVERS.match(name) and LOOP_FILES.search(path)):
            idle += own
        key = (fn, path)
        self_time[key] = self_time.get(key, 0.0) + own
    sampled = float(root.time) if root is not None else 0.0
    base = max(duration, sampled, 1e-9)
    busy = max(0.0, min(1.0, (sampled - idle) / base))
    top = sorted(self_time.items(), key=lambda kv: -kv[1])[:top_n]
    return {"kind": "summary", "who": who, "duration_s": round(duration, 3), "busy_ratio": round(busy, 4),
            "idle_ratio": round(1.0 - busy, 4),
            "top": [{"function": f, "file": p, "self_s": round(s, 4)} for (f, p), s in top]}


def save_session(session: Any, bundle_dir: Path, stem: str) -> list[str]:
    """Write <stem>.pyisession and <stem>.html under bundle_dir/artifacts; returns the file names."""
    from pyinstrument.renderers import HTMLRenderer

    art = bundle_dir / "artifacts"
    art.mkdir(parents=True, exist_ok=True)
    session.save(str(art / f"{stem}.pyisession"))
    (art / f"{stem}.html").write_text(HTMLRenderer().render(session), encoding="utf-8")
    return [f"{stem}.pyisession", f"{stem}.html"]


class ClientProfilerProbe:
    """Profiles the capture's own event-loop thread (the load client) with pyinstrument."""

    name = NAME

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        try:
            import pyinstrument  # noqa: F401
        except ImportError:
            return False, "pyinstrument is not installed (pip install pyinstrument)"
        return True, ""

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        ok, why = self.available(ctx)
        if not ok:
            return ProbeStatus(NAME, "unavailable", why)
        from pyinstrument import Profiler

        prof = Profiler(interval=self.interval_s, async_mode="disabled")
        try:
            prof.start()
        except RuntimeError as e:  # another profiler already active on this thread
            return ProbeStatus(NAME, "failed", f"cannot start pyinstrument: {e}")
        try:
            await ctx.stop.wait()
        finally:
            session = prof.stop()
        summary = summarize(session, "client")
        files = await asyncio.to_thread(save_session, session, ctx.bundle.path, "pyinstrument_client")
        for f in files:
            ctx.bundle.add_artifact(f, "pyinstrument", "pyinstrument profile of the load client's event loop")
        ctx.bundle.stream("client_profile", "pyinstrument summary of the profiled event loop").write(summary)
        return ProbeStatus(NAME, "ok", "", {"busy_ratio": summary["busy_ratio"],
                                            "duration_s": summary["duration_s"],
                                            "top": summary["top"][:5]})


# -- diagnose run -- python server.py ... -----------------------------------------------------------
_BOOT = r"""
import os, runpy, signal, sys
out, stem, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
sys.argv = sys.argv[4:]
try:
    from pyinstrument import Profiler
    from pyinstrument.renderers import HTMLRenderer
except ImportError:
    sys.stderr.write("diagnose run: pyinstrument is not installed for " + sys.executable + "\n")
    sys.exit(97)
def _stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background parent may have left SIGINT ignored
prof = Profiler(interval=interval, async_mode="disabled")
prof.start()
code = 0
try:
    if sys.argv[0] == "-m":
        sys.argv = sys.argv[1:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        runpy.run_path(sys.argv[0], run_name="__main__")
except KeyboardInterrupt:
    code = 0
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
finally:
    s = prof.stop()
    os.makedirs(out, exist_ok=True)
    s.save(os.path.join(out, stem + ".pyisession"))
    with open(os.path.join(out, stem + ".html"), "w", encoding="utf-8") as fh:
        fh.write(HTMLRenderer().render(s))
sys.exit(code)
"""


def _split_python(argv: list[str]) -> tuple[str, list[str]]:
    """(interpreter, rest) for 'python script.py ...', 'python -m mod ...', 'script.py ...' or a console
    script with a Python shebang."""
    if not argv:
        raise InputError("diagnose run: give the server command after --, e.g. -- python server.py")
    first = argv[0]
    if re.match(r"^python[0-9.]*$", os.path.basename(first)):
        exe = shutil.which(first) or first
        return exe, argv[1:]
    path = first if os.path.exists(first) else shutil.which(first)
    if path is None:
        raise InputError(f"diagnose run: {first!r} not found")
    if path.endswith(".py"):
        return sys.executable, [path, *argv[1:]]
    try:
        with open(path, "rb") as fh:
            line = fh.readline().decode("utf-8", "replace").strip()
    except OSError as e:
        raise InputError(f"diagnose run: cannot read {path}: {e.strerror}") from e
    if line.startswith("#!") and "python" in line:
        words = line[2:].split()
        interp = (shutil.which(words[1]) if len(words) > 1 else None) if words[0].endswith("env") else words[0]
        return interp or sys.executable, [path, *argv[1:]]
    raise InputError(f"diagnose run: {first!r} is not a Python program (profiling needs a Python server)")


def redact(argv: list[str]) -> list[str]:
    """The command line as stored in the bundle: values of --api-key, --token... replaced."""
    out: list[str] = []
    hide = False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        if a.startswith("-") and _SECRET_FLAGS.search(a):
            if "=" in a:
                out.append(a.split("=", 1)[0] + "=***")
            else:
                out.append(a)
                hide = True
            continue
        out.append(a)
    return out


def run_under_profiler(argv: list[str], bundle_dir: str, *, interval_s: float = 0.001,
                       force: bool = False) -> int:
    """Run a Python server under pyinstrument; write a bundle with its profile; return its exit status."""
    exe, rest = _split_python(list(argv))
    if not rest:
        raise InputError("diagnose run: no script or -m module to run")
    bw = BundleWriter(bundle_dir, overwrite=force, target={"command": redact(list(argv)), "pid": None},
                      workload={"mode": "observe"}, options={"profiler": "pyinstrument", "interval_s": interval_s})
    art = bw.path / "artifacts"
    cmd = [exe, "-c", _BOOT, str(art), "pyinstrument_server", str(interval_s), *rest]
    t0 = time.monotonic()
    try:
        child = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    except OSError as e:
        bw.set_probe_status(ProbeStatus(NAME, "failed", f"cannot start {exe}: {e.strerror or e}"))
        bw.finish(interrupted="server did not start")
        raise InputError(f"diagnose run: cannot start {exe}: {e.strerror or e}") from e
    bw.update("target", {"pid": child.pid})
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def forward(signum: int, frame: Any) -> None:
        child.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    for s in previous:
        signal.signal(s, forward)
    try:
        _, err = child.communicate()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    code = child.returncode
    errtext = err.decode("utf-8", "replace")
    if err:
        sys.stderr.write(errtext)
    session_file = art / "pyinstrument_server.pyisession"
    if code == 97 and "pyinstrument is not installed" in errtext:
        bw.set_probe_status(ProbeStatus(NAME, "unavailable", f"pyinstrument is not installed for {exe}"))
        bw.finish(interrupted="no profiler")
        raise InputError(f"diagnose run: pyinstrument is not installed for {exe} (pip install pyinstrument there)")
    if not session_file.exists():
        bw.set_probe_status(ProbeStatus(NAME, "failed", f"the server exited ({code}) without writing a profile"))
        bw.finish(interrupted=f"server exited with status {code}")
        return code if code else 1
    from pyinstrument.session import Session

    session = Session.load(str(session_file))
    summary = summarize(session, "server")
    for f in ("pyinstrument_server.pyisession", "pyinstrument_server.html"):
        bw.add_artifact(f, "pyinstrument", "pyinstrument profile of the server's main thread (event loop)")
    bw.stream("client_profile", "pyinstrument summary of the profiled event loop").write(summary)
    bw.set_probe_status(ProbeStatus(NAME, "ok", "", {"busy_ratio": summary["busy_ratio"],
                                                     "exit_status": code, "wall_s": round(time.monotonic() - t0, 3),
                                                     "top": summary["top"][:5]}))
    bw.finish()
    return code


def load_summary(bundle_dir: Path) -> dict[str, Any] | None:
    p = bundle_dir / "client_profile.jsonl"
    if not p.exists():
        return None
    for line in p.read_bytes().splitlines():
        if line.strip():
            rec = orjson.loads(line)
            return rec if isinstance(rec, dict) else None
    return None


# -- attach options -------------------------------------------------------------------------------------
def _build(o: Options, setup: ProbeSetup) -> ClientProfilerProbe:
    return ClientProfilerProbe()


SPEC = ProbeSpec(
    name=NAME, title="Client profile (pyinstrument)",
    enabled=lambda o: bool(o["profile_client"]), build=_build,
    options=(ProbeOption("--profile-client", flag=True, help="Profile the load client itself with pyinstrument."),),
)
