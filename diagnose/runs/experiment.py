"""Run a finding's experiment for real: start the server diagnose was given the command of, capture, diagnose,
restart it with the one variable the top finding's experiment names changed, capture the same workload again
(same seed), and verify (docs/compare.md, "diagnose experiment").

diagnose changes only a server it started itself: the command line is the user's, and the only edit is the
one engine flag of the experiment (set, replaced, added or removed). Experiments whose variable is not an
engine flag (a client setting, an environment variable, a deployment change) are not run: the result says
what to change by hand and to `diagnose verify` the two runs.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from diagnose.engines.experiments import ENGINE_FLAGS, flag_for
from diagnose.errors import DiagnoseError, InputError, TargetError


class LaunchError(TargetError):
    """The server command did not start a server that answers."""


#: every process of a launched server carries this variable (set in the command's environment, inherited by
#: whatever it starts): how its descendants are found after they left its process group and session
TAG_ENV = "DIAGNOSE_LAUNCH_ID"
STOP_GRACE_S = 30.0  # from SIGTERM to SIGKILL
KILL_WAIT_S = 10.0  # for SIGKILLed processes to be gone


@dataclass
class Launched:
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    tag: str = ""
    started: float = field(default_factory=time.time)

    def members(self) -> list[psutil.Process]:
        """Every live process of the server: the command's process, its descendants, everything in its process
        group or session, and every process that carries its tag (a child that called setsid, a daemon
        that double-forked). Zombies are not counted: they are gone, only not yet reaped."""
        found: dict[int, psutil.Process] = {}

        def add(p: psutil.Process) -> None:
            try:
                if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE:
                    found.setdefault(p.pid, p)
            except psutil.Error:
                pass

        try:
            root = psutil.Process(self.proc.pid)
            if self.proc.poll() is None:
                add(root)
                for c in root.children(recursive=True):
                    add(c)
        except psutil.Error:
            pass
        pid, uid = self.proc.pid, os.getuid()
        for p in psutil.process_iter(["create_time", "uids"]):
            try:
                if p.pid in found or p.info["create_time"] < self.started - 1 or p.info["uids"].real != uid:
                    continue  # older than the launch, or not ours to signal
                if os.getpgid(p.pid) == pid or os.getsid(p.pid) == pid or \
                        (self.tag and p.environ().get(TAG_ENV) == self.tag):
                    add(p)
            except (psutil.Error, OSError):
                continue
        return list(found.values())

    def crash(self) -> list[int]:
        """Kill the whole server as a crash does: SIGKILL to every process of it at once (no SIGTERM, no drain),
        then :meth:`stop` for what the signal missed. Returns the PIDs still alive after that."""
        self._signal(self.members(), signal.SIGKILL)
        return self.stop(grace_s=0.0)

    def stop(self, grace_s: float = STOP_GRACE_S) -> list[int]:
        """Stop the whole server: SIGTERM to its process group and to every process of it (:meth:`members`,
        taken before the signal), SIGKILL to what is left after ``grace_s``, then check. Returns the PIDs still
        alive after all that (none, unless a process could not be signalled)."""
        procs = self.members()
        self._signal(procs, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        left = procs
        while True:
            self._reap()
            left = [p for p in left if _alive(p)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for _ in range(3):  # what is left, and what the survivors started meanwhile
            left = _union(left, self.members())
            if not left:
                break
            self._signal(left, signal.SIGKILL)
            until = time.monotonic() + KILL_WAIT_S
            while left and time.monotonic() < until:
                self._reap()
                left = [p for p in left if _alive(p)]
                if left:
                    time.sleep(0.05)
        self._reap()
        return sorted(p.pid for p in left if _alive(p))

    def _signal(self, procs: list[psutil.Process], sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in procs:
            try:
                p.send_signal(sig)  # psutil checks the PID still names the same process
            except psutil.Error:
                pass

    def _reap(self) -> None:
        try:
            self.proc.wait(0)
        except subprocess.TimeoutExpired:
            pass


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _union(a: list[psutil.Process], b: list[psutil.Process]) -> list[psutil.Process]:
    seen = {p.pid for p in a}
    return a + [p for p in b if p.pid not in seen]


def split_launch(cmd: str, option: str = "--launch") -> list[str]:
    """The server command line as its argv; an :class:`InputError` (exit 2, one line) for an empty one or
    one that shell quoting cannot split (an unbalanced quote)."""
    try:
        argv = shlex.split(cmd)
    except ValueError as e:
        raise InputError(f"{option} {cmd!r}: cannot split it into arguments: {e} (an unbalanced quote?)") from None
    if not argv:
        raise InputError(f"{option}: an empty command")
    return argv


def parse_set(override: str) -> tuple[str, str]:
    """``--set --flag=VALUE`` as (flag, value); an :class:`InputError` (exit 2, one line) for anything else."""
    flag, sep, value = override.partition("=")
    if not sep or not flag.startswith("-") or not flag.strip("-") or any(c.isspace() for c in flag):
        raise InputError(f"--set {override!r}: use --flag=VALUE (the engine flag to change and its value)")
    return flag, value


def check_startup_timeout(seconds: float, option: str = "--startup-timeout") -> float:
    """Seconds to wait for a launched server: a finite number above 0, else an :class:`InputError`."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise InputError(f"{option} {seconds}: expected seconds above 0")
    return float(seconds)


def _tail(path: Path, n: int = 5) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return " | ".join(x.strip() for x in lines if x.strip())


def spawn(argv: Sequence[str], log_path: Path, log: Callable[[str], None] = lambda _m: None) -> Launched:
    """Start the server command in its own process group (output to ``log_path``, tagged so that what it starts
    can be found and stopped); a :class:`LaunchError` when it cannot be started. Used by ``launch`` here and by
    ``diagnose readiness`` (which times the start itself)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    started = time.time()
    out: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - the child writes to it; closed with the process
    try:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, TAG_ENV: tag})
    except OSError as e:
        out.close()
        raise LaunchError(f"cannot start the server command {argv[0]!r}: {e.strerror or e}") from e
    out.close()
    log(f"started: {shlex.join(argv)} (pid {proc.pid}, log {log_path})")
    return Launched(list(argv), proc, log_path, tag, started)


def launch(argv: Sequence[str], url: str, log_path: Path, timeout_s: float = 600.0,
           log: Callable[[str], None] = lambda _m: None) -> Launched:
    """Start the server command in its own process group; return once ``url``/v1/models answers 200."""
    timeout_s = check_startup_timeout(timeout_s)
    server = spawn(argv, log_path, log)
    proc = server.proc
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            server.stop()  # what it started before it exited
            raise LaunchError(f"the server command exited with status {proc.returncode} before answering "
                              f"(log {log_path}: {_tail(log_path)})")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2.0) as r:  # noqa: S310 - the user's URL
                if r.status == 200:
                    return server
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise LaunchError(f"the server at {url} did not answer /v1/models within {timeout_s:.0f} s "
                              f"(log {log_path}: {_tail(log_path)})")
        time.sleep(0.5)


def apply_flag(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """The command line with one engine flag changed. ``flag`` as ENGINE_FLAGS spells it: ``--x`` (set to
    ``value``: replaced where present as ``--x V`` or ``--x=V``, else appended; value ``on`` adds a bare
    ``--x``, ``off`` removes it) or ``--x (remove)`` (removed, with a value that follows it)."""
    name = flag.split(" ")[0]
    remove = flag.endswith("(remove)") or value == "off"
    out: list[str] = []
    i, found = 0, False
    args = list(argv)
    while i < len(args):
        a = args[i]
        if a == name or a.startswith(name + "="):
            found = True
            has_value = a == name and i + 1 < len(args) and not args[i + 1].startswith("--")
            if not remove:
                out += [name] if value == "on" else [name, value]
            i += 2 if has_value else 1
            continue
        out.append(a)
        i += 1
    if not found and not remove:
        out += [name] if value == "on" else [name, value]
    return out


@dataclass
class Plan:
    finding: str
    variable: str
    flag: str
    value: str
    argv_after: list[str]


def plan(before_dir: Path, argv: Sequence[str], finding: str | None = None,
         override: tuple[str, str] | None = None) -> tuple[Plan | None, str]:
    """What to change for the experiment of BEFORE's top finding (or ``finding``); ``override`` = (flag,
    value) sets that flag instead (to test a variable that is not the finding's). Returns (plan, '') or
    (None, why it cannot be run automatically)."""
    from diagnose.compare.verify import chosen_cause
    from diagnose.pipeline import analyze

    a = analyze(before_dir)
    if not a.run_valid:
        head = a.verdict.headline if a.verdict else "invalid"
        return None, f"the first run is invalid ({head}): nothing measured on it can be compared; fix that first"
    fid = finding or (a.verdict.top_rule if a.verdict else None)
    f = next((x for x in a.findings if x.rule_id == fid), None)
    if f is None:
        return None, f"finding {fid or '(none)'} did not fire in the first run: nothing to verify"
    if override is not None:
        return Plan(f.rule_id, override[0], override[0], override[1], apply_flag(argv, *override)), ""
    cause = chosen_cause(f)
    exp = cause.experiment if cause else None
    if exp is None or not exp.variable:
        return None, f"{f.rule_id}: its experiment names no variable"
    if exp.variable_kind != "engine_flag":
        return None, (f"{f.rule_id}: the experiment changes a {exp.variable_kind.replace('_', ' ')} setting "
                      f"({exp.variable}), which diagnose does not change for you: {exp.change}; then run "
                      "`diagnose verify BEFORE AFTER`")
    flag = flag_for(exp.variable, a.engine)
    if not flag:
        known = ", ".join(sorted(ENGINE_FLAGS[exp.variable][1])) if exp.variable in ENGINE_FLAGS else ""
        return None, f"{f.rule_id}: no {a.engine} flag is known for {exp.variable} (known for: {known})"
    if not exp.value and not flag.endswith("(remove)"):
        return None, f"{f.rule_id}: the experiment suggests no value for {flag} in this run: {exp.change}"
    return Plan(f.rule_id, exp.variable, flag, exp.value, apply_flag(argv, flag, exp.value)), ""


def attach_argv(url: str, out: Path, attach_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "diagnose", "attach", "--url", url, "-o", str(out), "--force", *attach_args]


# The attach options that shape the load (copied into the warm-up run); everything else (probes, sweeps'
# request counts, SLO, reports) is left out of it.
_SHAPE_VALUE = frozenset({"--api", "-c", "--concurrency", "-r", "--rate", "--arrival", "--burstiness",
                          "--max-concurrency", "--input-tokens", "--output-tokens", "--shared-prefix",
                          "--timeout", "--api-key-env", "--model", "--workload", "--speed", "--dataset",
                          "--dataset-format"})
_SHAPE_FLAG = frozenset({"--realtime", "--ignore-eos", "--no-ignore-eos"})


def warmup_args(attach_args: Sequence[str], seconds: float) -> list[str]:
    """The attach arguments of the warm-up run before a measured one: the same load shape (API, concurrency
    or rate, lengths, priority) for ``seconds`` per level, with no baseline phase and no probe but the load
    and /metrics. A freshly started engine is cold (first-seen batch shapes, allocator, caches): two runs
    started cold differ by more than the change under test (docs/compare.md, "cold and warm")."""
    out: list[str] = []
    args = list(attach_args)
    i = 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if name in _SHAPE_VALUE:
            if "=" in a:
                out.append(a)
            elif i + 1 < len(args):
                out += [a, args[i + 1]]
                i += 1
        elif a in _SHAPE_FLAG:
            out.append(a)
        i += 1
    return [*out, "--duration", f"{seconds:g}s", "--baseline", "0", "--warmup", "0", "--no-nvml"]


def capture(argv: Sequence[str], url: str, out: Path, attach_args: Sequence[str], log: Callable[[str], None],
            startup_timeout_s: float, warmup_s: float = 0.0) -> None:
    """Start the server, warm it up (``warmup_s`` seconds of the same load into ``<out>-warmup``, kept but
    never analysed), run one `diagnose attach` against it, stop the server (always)."""
    server = launch(argv, url, out.parent / f"{out.name}-server.log", startup_timeout_s, log)
    try:
        if warmup_s > 0:
            warm = out.parent / f"{out.name}-warmup"
            w = subprocess.run(attach_argv(url, warm, warmup_args(attach_args, warmup_s)), capture_output=True,
                               text=True, timeout=3600)
            last = (w.stderr.strip().splitlines() or ["no output"])[-1]
            log(f"warm-up: {warmup_s:g} s of the same load into {warm}"
                + ("" if w.returncode == 0 else f" (exit {w.returncode}: {last})"))
        p = subprocess.run(attach_argv(url, out, attach_args), capture_output=True, text=True, timeout=3600)
        if p.returncode not in (0,):
            last = (p.stderr.strip().splitlines() or ["no output"])[-1]
            raise DiagnoseError(f"the capture into {out} failed (exit {p.returncode}): {last}")
    finally:
        left = server.stop()
        if left:
            log(f"warning: server processes still running after SIGKILL: {', '.join(map(str, left))}")


def valid_capture(argv: Sequence[str], url: str, out: Path, attach_args: Sequence[str], log: Callable[[str], None],
                  startup_timeout_s: float, warmup_s: float = 0.0) -> list[str]:
    """``capture``, repeated once when the run is invalid (a validity rule fired, e.g. the load client was
    starved: then nothing was measured, and a second try is what an engineer would do). Returns the reasons
    of the invalid tries (recorded in experiment.json); a run still invalid after the repeat is kept, and
    the verification then says the runs are not comparable."""
    from diagnose.pipeline import analyze

    invalid: list[str] = []
    for attempt in (1, 2):
        capture(argv, url, out, attach_args, log, startup_timeout_s, warmup_s)
        a = analyze(out)
        if a.run_valid:
            return invalid
        why = a.verdict.headline if a.verdict else "invalid"
        invalid.append(why)
        if attempt == 1:
            log(f"{out.name}: {why}; repeating this run once")
    return invalid


def refuse_running(url: str) -> None:
    """diagnose starts its own server and changes only that one: an error when something answers at ``url``."""
    answers = False
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2.0):  # noqa: S310 - the user's URL
            answers = True
    except urllib.error.HTTPError:
        answers = True  # it answered, with an error status
    except OSError:
        pass  # nothing answers there: good
    if answers:
        raise DiagnoseError(f"a server already answers at {url}: diagnose starts its own server (--launch) and "
                            "changes only that one; stop it or use another port")


def check_url(url: str) -> str:
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InputError(f"--url {url!r}: expected http://HOST:PORT")
    return url
