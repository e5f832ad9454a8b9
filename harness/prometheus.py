"""Start and stop a real Prometheus server on loopback for the fleet tests (a context manager).

    with PrometheusServer({"vllm": [a.url, b.url]}, scrape_interval_s=1) as prom:
        prom.wait_scraped(2)        # every target has been scraped (up == 1) at least this often
        print(prom.url)             # http://127.0.0.1:PORT

The config is generated into a temporary directory (one job per key, its static targets), storage is a
temporary TSDB there, and it listens on 127.0.0.1 only. ``stop()`` terminates it (then kills it) and removes
the directory. The binary is Debian's ``prometheus`` (harness/ensure_prometheus.sh installs it), or
``$DIAGNOSE_PROMETHEUS``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from pathlib import Path
from types import TracebackType

from harness.engine import HARNESS_DIR, EngineError, free_port

_LIVE: weakref.WeakSet[PrometheusServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


def prometheus_binary() -> str | None:
    return shutil.which(os.environ.get("DIAGNOSE_PROMETHEUS") or "prometheus")


class PrometheusServer:
    def __init__(self, jobs: dict[str, list[str]], scrape_interval_s: float = 1.0, port: int | None = None,
                 startup_timeout_s: float = 60.0) -> None:
        self.jobs = {k: [urllib.parse.urlparse(u).netloc or u for u in v] for k, v in jobs.items()}
        self.scrape_interval_s = scrape_interval_s
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        lines = ["global:", f"  scrape_interval: {interval}", f"  evaluation_interval: {interval}", "scrape_configs:"]
        for job, targets in self.jobs.items():
            lines += [f"  - job_name: {json.dumps(job)}", f"    scrape_timeout: {interval}", "    static_configs:",
                      f"      - targets: {json.dumps(targets)}"]
        return "\n".join(lines) + "\n"

    def start(self) -> PrometheusServer:
        binary = prometheus_binary()
        if binary is None:
            raise EngineError("no prometheus binary: run `bash harness/ensure_prometheus.sh` (Debian's package)")
        self.dir = Path(tempfile.mkdtemp(prefix="diagnose-prom-"))
        (self.dir / "prometheus.yml").write_text(self.config())
        log = open(self.dir / "prometheus.log", "ab")  # noqa: SIM115 - the child holds it; closed with the dir
        self._proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             "--web.enable-lifecycle"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        # the vLLM harness's watchdog: kills the server's group if this process dies without stop()
        self._reaper = subprocess.Popen([sys.executable, str(HARNESS_DIR / "_reaper.py"), str(os.getpid()),
                                         str(self._proc.pid)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        _LIVE.add(self)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.tail_log()
                self.stop()
                raise EngineError(f"prometheus exited with {self._proc and self._proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        tail = self.tail_log()
        self.stop()
        raise EngineError(f"prometheus not ready within {self.startup_timeout_s:.0f} s: {tail}")

    def query(self, promql: str) -> list[dict[str, object]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            data = json.loads(r.read())
        return list(data["data"]["result"])

    def wait_scraped(self, scrapes: int = 2, timeout_s: float = 60.0) -> None:
        """Until every target is up and has at least ``scrapes`` samples of ``up``."""
        n = sum(len(v) for v in self.jobs.values())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            res = self.query("count_over_time(up[5m]) and on(instance, job) (up == 1)")
            if len(res) >= n and all(float(r["value"][1]) >= scrapes for r in res):  # type: ignore[index]
                return
            time.sleep(0.5)
        raise EngineError(f"prometheus at {self.url} did not scrape all {n} targets within {timeout_s:.0f} s")

    def tail_log(self, lines: int = 10) -> str:
        if self.dir is None:
            return ""
        try:
            text = (self.dir / "prometheus.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        _LIVE.discard(self)
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.kill()
            reaper.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
