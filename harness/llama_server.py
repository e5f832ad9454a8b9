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

import os
import signal
import sys
import time
from pathlib import Path

from diagnose.errors import DiagnoseError
from harness.engine import EngineError, ServerProcess, cache_root, run_ensure

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
    run_ensure(ENSURE_SCRIPT, llama_ready, timeout_s, quiet)


class LlamaServer(ServerProcess):
    """A llama.cpp ``llama-server`` on 127.0.0.1 serving the tiny GGUF model (a context manager).

    ``n_parallel`` is ``-np`` (slots); ``ctx_size`` is ``-c``, the *total* KV context, which llama-server
    splits evenly between the slots: the default, ``2048 * n_parallel``, gives each slot the model's 2,048
    positions (vLLM's ``max_model_len`` in :class:`harness.engine.VllmServer`).
    """

    NAME = "llama-server"
    LOG_PREFIX = "diagnose-llama"
    POLL_S = 0.2  # it is ready in ~50 ms
    STOP_TIMEOUT_S = 15.0

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
        self._init_process(port, log_path, startup_timeout_s, extra_args, env)
        self.model_path = Path(model_path) if model_path is not None else tiny_gguf_path()
        self.n_parallel = int(n_parallel)
        self.ctx_size = int(ctx_size) if ctx_size is not None else 2048 * self.n_parallel
        self.threads = int(threads)
        self.served_model_name = served_model_name
        self.metrics = metrics
        self.slots = slots

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

    def check_built(self) -> None:
        binary = llama_server_bin()
        if not binary.is_file() or not self.model_path.is_file():
            raise EngineError(
                f"llama-server not built: need {binary} and {self.model_path} "
                "(run `bash harness/ensure_llama.sh` or harness.llama_server.ensure_llama())"
            )


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
