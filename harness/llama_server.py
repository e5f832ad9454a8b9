"""Start and stop a real llama.cpp ``llama-server`` (CPU, the tiny model as GGUF) for tests and manual use.

The second real engine next to :mod:`harness.engine` (vLLM). Typical use::

    from harness.llama_server import LlamaServer, ensure_llama

    ensure_llama()                       # builds llama-server + the tiny GGUF once (~/.cache/diagnose)
    with LlamaServer(n_parallel=2) as server:
        print(server.url, server.pid)    # http://127.0.0.1:PORT, the llama-server PID
        ...                              # /health is 200 here

``LlamaServer`` runs ``llama-server -m MODEL --alias tiny-llama --host 127.0.0.1 --port P --metrics --slots
-np N -c CTX -t THREADS [extra args]`` in its own session/process group and waits for ``GET /health`` ==
200 (503 while the model loads). If the server dies or times out first it raises
:class:`harness.engine.EngineError` with the last lines of its log. ``stop()`` SIGTERMs the group, waits,
then SIGKILLs; it runs on ``__exit__`` and at interpreter exit, and a ``_reaper.py`` watchdog kills the
group if the owning process dies without stopping it.

CLI for manual use::

    python -m harness.llama_server ensure
    python -m harness.llama_server serve [--port P] [--parallel N] [-- extra llama-server args]

Environment: ``DIAGNOSE_CACHE_DIR`` (default ``~/.cache/diagnose``), ``DIAGNOSE_LLAMA_DIR`` (the build
folder), ``DIAGNOSE_TINY_GGUF`` (the model file), ``DIAGNOSE_ENGINE_STARTUP_TIMEOUT`` (seconds, default
240). ``LLAMA_ARG_*`` variables of the caller are dropped: llama-server reads them as flags.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

from diagnose.errors import DiagnoseError
from diagnose.realtime import normal_priority_in_child
from harness.engine import EngineError, _signal_group, _wait_gone, cache_root, free_port

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the PyPI sdist whose vendored llama.cpp is built
LLAMA_CPP_COMMIT = "0c1e57098"  # ggml-org/llama.cpp commit of that sdist (its CHANGELOG)
SERVED_MODEL_NAME = "tiny-llama"  # --alias: the same model name the vLLM harness serves
HARNESS_DIR = Path(__file__).resolve().parent
ENSURE_SCRIPT = HARNESS_DIR / "ensure_llama.sh"


def llama_dir() -> Path:
    """The build folder: ``bin/llama-server``, ``convert/`` (the vendored converter), ``BUILD_INFO``."""
    env = os.environ.get("DIAGNOSE_LLAMA_DIR")
    return Path(env).expanduser() if env else cache_root() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}"


def llama_server_bin() -> Path:
    """The ``llama-server`` binary (exists once :func:`ensure_llama` has run)."""
    return llama_dir() / "bin" / "llama-server"


def tiny_gguf_path() -> Path:
    """The tiny model (harness/tiny_model.py) converted to GGUF f16 by harness/tiny_gguf.py."""
    env = os.environ.get("DIAGNOSE_TINY_GGUF")
    return Path(env).expanduser() if env else cache_root() / "models" / "tiny-llama-v1.gguf"


def llama_ready() -> bool:
    """True when llama-server is completely built (its `.ready` marker) and the GGUF model exists."""
    return (llama_dir() / ".ready").is_file() and tiny_gguf_path().is_file()


def ensure_llama(timeout_s: float = 3600.0, quiet: bool = False) -> None:
    """Build llama-server and the tiny GGUF when missing (runs harness/ensure_llama.sh; ~15 min on 2 cores)."""
    if llama_ready():
        return
    try:
        proc = subprocess.run(
            ["bash", str(ENSURE_SCRIPT)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"{ENSURE_SCRIPT} did not finish within {timeout_s:.0f} s") from exc
    if not quiet:
        sys.stderr.write(proc.stdout)
    if proc.returncode != 0 or not llama_ready():
        tail = " | ".join(proc.stdout.strip().splitlines()[-5:])
        raise EngineError(f"{ENSURE_SCRIPT} failed (exit {proc.returncode}): {tail}")


_LIVE: weakref.WeakSet[LlamaServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


class LlamaServer:
    """A llama.cpp ``llama-server`` on 127.0.0.1 serving the tiny GGUF model (a context manager).

    ``n_parallel`` is ``-np`` (slots); ``ctx_size`` is ``-c``, the *total* KV context, which llama-server
    splits evenly between the slots: the default, ``2048 * n_parallel``, gives each slot the model's 2,048
    positions (vLLM's ``max_model_len`` in :class:`harness.engine.VllmServer`).
    """

    def __init__(
        self,
        port: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        model_path: str | os.PathLike[str] | None = None,
        n_parallel: int = 2,
        ctx_size: int | None = None,
        threads: int = 2,
        served_model_name: str = SERVED_MODEL_NAME,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float | None = None,
        metrics: bool = True,
        slots: bool = True,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.model_path = Path(model_path) if model_path is not None else tiny_gguf_path()
        self.n_parallel = int(n_parallel)
        self.ctx_size = int(ctx_size) if ctx_size is not None else 2048 * self.n_parallel
        self.threads = int(threads)
        self.served_model_name = served_model_name
        self.metrics = metrics
        self.slots = slots
        self.log_path = Path(log_path) if log_path is not None else self._default_log_path()
        if startup_timeout_s is None:
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
        cmd = [
            str(llama_server_bin()),
            "-m", str(self.model_path),
            "--alias", self.served_model_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-np", str(self.n_parallel),
            "-c", str(self.ctx_size),
            "-t", str(self.threads),
        ]  # fmt: skip
        if self.metrics:
            cmd.append("--metrics")
        cmd.append("--slots" if self.slots else "--no-slots")
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        # llama-server takes every flag from a LLAMA_ARG_* variable too: a caller's would change the server
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        env.update(HF_HUB_OFFLINE="1", DO_NOT_TRACK="1")
        env.update(self.env)
        return env

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> LlamaServer:
        if self.running:
            return self
        binary = llama_server_bin()
        if not binary.is_file() or not self.model_path.is_file():
            raise EngineError(
                f"llama-server not built: need {binary} and {self.model_path} "
                "(run `bash harness/ensure_llama.sh` or harness.llama_server.ensure_llama())"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file = log
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,  # own process group: stop() signals the whole tree
            preexec_fn=normal_priority_in_child,  # never the caller's real-time policy (see engine.py)
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
                    f"llama-server on port {self.port} exited with code {code} before /health was ready; "
                    f"log {self.log_path}: {self.tail_log()}"
                )
            if self.health_ok():
                return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"llama-server on port {self.port} not healthy within {self.startup_timeout_s:.0f} s; "
                    f"log {self.log_path}: {self.tail_log()}"
                )
            time.sleep(0.2)

    def health_ok(self, timeout_s: float = 2.0) -> bool:
        """``GET /health`` == 200 (llama-server answers 503 while the model is loading)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def processes(self) -> list[psutil.Process]:
        """llama-server and any descendants (it is one process; kept for symmetry with VllmServer)."""
        if not self.running or self.pid is None:
            return []
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, term_timeout_s: float = 15.0) -> None:
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
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.terminate()
            alive = _wait_gone(proc, tree, term_timeout_s)
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
        fd, name = tempfile.mkstemp(prefix=f"diagnose-llama-{self.port}-", suffix=".log")
        os.close(fd)
        return Path(name)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LlamaServer(url={self.url!r}, pid={self.pid}, log={str(self.log_path)!r})"


def _main(argv: list[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra, argv = argv[argv.index("--") + 1 :], argv[: argv.index("--")]
    parser = argparse.ArgumentParser(
        prog="python -m harness.llama_server", description="real llama-server harness"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure", help="build llama-server and the tiny GGUF if missing")
    serve = sub.add_parser("serve", help="start a server until Ctrl-C (args after -- go to llama-server)")
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--parallel", type=int, default=2, help="-np, slots (default 2)")
    serve.add_argument("--ctx", type=int, default=None, help="-c, total context (default 2048 per slot)")
    serve.add_argument("--threads", type=int, default=2, help="-t (default 2)")
    serve.add_argument("--log", default=None, help="server log file (default: a temp file)")
    serve.add_argument("--timeout", type=float, default=None, help="startup timeout, s (default 240)")
    args = parser.parse_args(argv)
    try:
        ensure_llama()
        if args.cmd == "ensure":
            print(f"llama-server: {llama_server_bin()}\ntiny gguf:    {tiny_gguf_path()}")
            return 0
        server = LlamaServer(
            port=args.port, extra_args=extra, n_parallel=args.parallel, ctx_size=args.ctx,
            threads=args.threads, log_path=args.log, startup_timeout_s=args.timeout,
        )  # fmt: skip
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
