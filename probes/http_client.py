"""Pooled keep-alive HTTP/1.1 client for one base URL: streamed completions and plain calls.

The response parsing lives in :mod:`diagnose.probes.sse` (why this project speaks HTTP itself instead of using
aiohttp is explained there). Network failures become a category (``refused``, ``connect``, ``reset``,
``timeout``) on the request's :class:`StreamResult`, never an exception, for streamed requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson

from diagnose.probes.sse import SseConnection, StreamResult, now_ns

CLIENT_LIMIT = "client limit:"  # how an error detail starts when the client, not the server, ran out
RX_BUDGET_NS = 1_000_000  # reads parsed per loop turn: until this much time is spent (HttpClient.drain_rx)


def client_fd_limit_detail(e: OSError) -> str:
    """EMFILE/ENFILE named for what it is: this process's (or the system's) open-file limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    which = "the system's open-file table is full (ENFILE)" if e.errno == errno.ENFILE else \
        f"the load client ran out of file descriptors (EMFILE; ulimit -n is {soft}, hard limit {hard})"
    return f"{CLIENT_LIMIT} {which}: this is diagnose's own limit, not the server's; raise ulimit -n or lower the concurrency"


class RequestFailed(Exception):
    """Raised by :meth:`HttpClient.request` for a non-streaming call that failed (category + detail)."""

    def __init__(self, category: str, detail: str) -> None:
        super().__init__(f"{category}: {detail}")
        self.category = category
        self.detail = detail


REUSE_FAILURES_MAX = 3  # reused connections the server had closed before connections stop being pooled


def _send(conn: SseConnection, data: bytes) -> None:
    """Writes a request on ``conn``. A server being killed accepts a connection and drops it before the
    connecting task resumes to write: connection_lost has run by then. The request fails as a reset before any
    byte (a reused connection retries it once on a fresh one). Before, uvloop's write raised 'unable to perform
    operation on <TCPTransport closed=True>; the handler is closed', which ended the load probe (CI, stop 41),
    and asyncio's dropped the bytes silently, so the request hung until its timeout."""
    if conn.closed or conn.transport is None:  # asyncio drops a write to a lost connection without a word:
        conn._fail("reset", "connection closed before the request was sent", retry=True)  # it would hang
        return
    try:
        conn.transport.write(data)
    except (RuntimeError, OSError) as e:
        conn._fail("reset", f"connection closed before the request was sent ({e})", retry=True)


class HttpClient:
    """Pooled keep-alive HTTP/1.1 client for one base URL (http or https)."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None,
                 connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0,
                 stall_timeout_s: float | None = None) -> None:
        u = urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad URL {base_url!r}: use http://HOST:PORT")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.query = f"?{u.query}" if u.query else ""  # the base URL's own query, kept after every path
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        hostport = self.host if u.port is None else f"{self.host}:{u.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head_tail = f"Host: {hostport}\r\n{extra}".encode("latin-1")
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_ns = int(request_timeout_s * 1e9)
        self.stall_timeout_ns = int((stall_timeout_s or request_timeout_s) * 1e9)
        self.continuous_usage = False
        self.reuse_failures = 0  # pooled connections found closed by the server when reused
        self.store_text = False
        # bytes read but not yet parsed, with their arrival stamps (see SseConnection.data_received)
        self.rx_pending: list[tuple[SseConnection, int, bytes]] = []
        self.rx_scheduled = False
        self._call_soon: Callable[..., Any] | None = None
        self._idle: deque[SseConnection] = deque()
        self._busy: set[SseConnection] = set()
        self._watchdog: asyncio.Task[None] | None = None

    # -- reads -------------------------------------------------------------------------------
    def schedule_rx(self) -> None:
        if self._call_soon is None:  # looked up once: asyncio.get_running_loop() costs a getpid() per call
            self._call_soon = asyncio.get_running_loop().call_soon
        self.rx_scheduled = True
        self._call_soon(self.drain_rx)

    def drain_rx(self, budget: bool = True) -> None:
        """Parses the reads stamped since the last turn, in arrival order: with ``budget`` until
        ``RX_BUDGET_NS`` is spent, the rest on the next turn (after the next poll has stamped what arrived
        meanwhile, and timers have run); without, all of them (a connection closing parses what it sent
        first).

        After a stall, or in a closed loop's wave, hundreds of reads wait: parsed in one callback they took
        4 ms and more, a turn in which nothing else ran and every timer was late (issue 18)."""
        self.rx_scheduled = False
        pending, self.rx_pending = self.rx_pending, []
        if not budget:
            for conn, t, data in pending:
                conn._on_data(data, t)
            return
        deadline = time.perf_counter_ns() + RX_BUDGET_NS
        n = len(pending)
        i = 0
        while i < n:
            conn, t, data = pending[i]
            i += 1
            conn._on_data(data, t)
            if not i & 7 and i < n and time.perf_counter_ns() >= deadline:
                rest = pending[i:]
                rest.extend(self.rx_pending)  # nothing is read during a callback, but keep the order regardless
                self.rx_pending = rest
                self.schedule_rx()
                return

    # -- pool --------------------------------------------------------------------------------
    async def _connect(self) -> SseConnection:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: SseConnection(self), self.host, self.port, ssl=self.ssl),
                self.connect_timeout_s)
        except ConnectionRefusedError as e:
            raise RequestFailed("refused", f"connection refused by {self.host}:{self.port}") from e
        except asyncio.TimeoutError as e:
            raise RequestFailed("connect", f"connect to {self.host}:{self.port} timed out "
                                           f"after {self.connect_timeout_s:g} s") from e
        except (OSError, socket.gaierror) as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise RequestFailed("connect", client_fd_limit_detail(e)) from e
            raise RequestFailed("connect", f"cannot connect to {self.host}:{self.port}: "
                                           f"{e.strerror or e}") from e
        sock = proto.transport.get_extra_info("socket") if proto.transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return proto

    def _release(self, conn: SseConnection) -> None:
        self._busy.discard(conn)
        if not conn.closed and self.reuse_failures >= REUSE_FAILURES_MAX:
            conn.closed = True  # the server closes them anyway: one fresh connection per request
            if conn.transport is not None:
                conn.transport.close()
        if not conn.closed:
            self._idle.append(conn)

    async def _acquire(self) -> tuple[SseConnection, bool]:
        while self._idle:
            c = self._idle.pop()
            if not c.closed and c.transport is not None and not c.transport.is_closing():
                return c, True  # (a transport the loop has closed, before connection_lost has run, is skipped)
        return await self._connect(), False

    def _done_with(self, conn: SseConnection, res: StreamResult) -> None:
        """This request no longer uses ``conn``. A connection whose response completed went back to the pool
        in ``_release`` (on the parse turn) and another worker may already have taken it and be waiting on it:
        it stays in the busy set then, so the watchdog still times that request out (issue 12, defect 20: the
        unconditional discard here hid such connections from the watchdog, so a stalled stream hung the
        capture, and halved the in-flight count)."""
        if conn.res is None or conn.res is res:
            self._busy.discard(conn)

    def in_flight(self) -> int:
        return len(self._busy)

    # -- requests ----------------------------------------------------------------------------
    def _request_bytes(self, method: str, path: str, body: bytes | None, extra: dict[str, str] | None) -> bytes:
        head = f"{method} {self.prefix}{path}{self.query} HTTP/1.1\r\n".encode("latin-1") + self._head_tail
        if extra:
            head += "".join(f"{k}: {v}\r\n" for k, v in extra.items()).encode("latin-1")
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        return head + b"\r\n" + (body or b"")

    async def stream(self, path: str, body: bytes, res: StreamResult, extra_headers: dict[str, str] | None = None,
                     on_sent: Callable[[int], None] | None = None) -> StreamResult:
        """POST ``body`` and read the SSE response into ``res``; never raises for server/network failures."""
        data = self._request_bytes("POST", path, body, extra_headers)
        for attempt in range(2):
            try:
                conn, reused = await self._acquire()
            except RequestFailed as e:
                res.error, res.error_detail, res.end_ns = e.category, e.detail, now_ns()
                if not res.sent_ns:
                    res.sent_ns = res.end_ns
                return res
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            conn.res, conn.fut, conn.got_bytes, conn.retry = res, fut, False, False
            conn.store_text = self.store_text
            conn.expect_sse = True
            self._busy.add(conn)
            t = now_ns()
            res.sent_ns = t
            conn.last_ns = t
            conn.deadline_ns = t + self.request_timeout_ns
            self._ensure_watchdog()
            _send(conn, data)
            if on_sent is not None:
                on_sent(t)
            try:
                await fut
            except asyncio.CancelledError:
                if conn.res is res:  # still ours: abandon the half-read response with its connection
                    conn.res, conn.fut = None, None
                    conn.closed = True
                    self._busy.discard(conn)
                    if conn.transport is not None:
                        conn.transport.close()
                # else it finished and went back to the pool (perhaps already in another worker's hands)
                raise
            self._done_with(conn, res)
            if self._resend(res, conn, reused, attempt):
                res.error = res.error_detail = None
                res.status = None
                continue
            break
        return res

    def _resend(self, res: StreamResult, conn: SseConnection, reused: bool, attempt: int) -> bool:
        """Whether to send the request once more, on a fresh connection: its first try went out on a pooled
        connection the server had closed before any byte of the answer (counted in ``reuse_failures``). A
        server that closes every connection after a streamed response (llama-server does, with Keep-Alive in
        its headers) makes every reuse fail first: after a few, connections are no longer reused."""
        if res.error == "reset" and reused and conn.retry and attempt == 0:
            self.reuse_failures += 1
            return True
        return False

    async def request(self, method: str, path: str, body: Any = None,
                      timeout_s: float = 10.0) -> tuple[int, bytes]:
        """A plain (non-streaming) call; returns (status, body); raises RequestFailed on network failure."""
        payload = orjson.dumps(body) if body is not None else None
        data = self._request_bytes(method, path, payload, None)
        for attempt in range(2):
            res = StreamResult()
            conn, reused = await self._acquire()
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            conn.res, conn.fut, conn.got_bytes, conn.retry = res, fut, False, False
            conn.store_text = False
            conn.expect_sse = False
            self._busy.add(conn)
            try:
                _send(conn, data)
                await asyncio.wait_for(fut, timeout_s)
            except asyncio.TimeoutError as e:
                conn._fail("timeout", f"no answer in {timeout_s:g} s")
                raise RequestFailed("timeout", f"{method} {path}: no answer in {timeout_s:g} s") from e
            finally:
                self._done_with(conn, res)
            if self._resend(res, conn, reused, attempt):  # as ``stream`` (an engine test's /tokenize call
                continue  # failed so once, and its prompt was estimated instead of measured)
            break
        if res.error and res.status is None:
            raise RequestFailed(res.error, f"{method} {path}: {res.error_detail}")
        return res.status or 0, res.body

    # -- timeouts ----------------------------------------------------------------------------
    def _ensure_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Fails requests past their deadline or silent for longer than the stall timeout (checked 10x/s)."""
        while self._busy:
            await asyncio.sleep(0.1)
            t = now_ns()
            for c in list(self._busy):
                if c.res is None:
                    continue
                if t > c.deadline_ns:
                    c._fail("timeout", f"request not finished after {self.request_timeout_ns / 1e9:g} s")
                elif t - c.last_ns > self.stall_timeout_ns:
                    c._fail("timeout", f"no bytes from the server for {self.stall_timeout_ns / 1e9:g} s")

    async def close(self) -> None:
        for c in list(self._idle) + list(self._busy):
            c.closed = True
            if c.transport is not None:
                c.transport.close()
        self._idle.clear()
        self._busy.clear()
        self.rx_pending.clear()
        self.rx_scheduled = False
        self._call_soon = None  # a later run may use another event loop
        if self._watchdog is not None:
            self._watchdog.cancel()
