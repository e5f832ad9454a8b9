"""A lean HTTP/1.1 + SSE streaming client for OpenAI-compatible completion endpoints.

Why not aiohttp: the load client must not be what it measures. On this machine (one core for the client, one
for the server) vLLM's aiohttp-based ``bench serve`` client tops out at ~140k-160k streamed tokens/s while a raw
asyncio client reaches the server's own ceiling (~230k, /work/shared/tools/README.md); the target is 1.3x the
former. benchmarks/client_bench.py measures both this client and a minimal aiohttp client of the same shape
(results in benchmarks/results/client_*.md). So this module speaks HTTP/1.1 itself on ``asyncio.Protocol``
(uvloop when the caller runs one): keep-alive pooled connections, chunked or length-delimited bodies, and an
SSE parser whose per-event work is a few ``bytes.find`` calls. Full JSON parsing happens only for events the
fast path does not recognise (usage-only chunks, errors) or when text is stored.

Every chunk is stamped with ``time.monotonic_ns()`` taken when its bytes were handed to ``data_received``
(events that arrive in one read share that time: they did arrive together).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from diagnose.probes.http_client import HttpClient

now_ns = time.monotonic_ns


async def sleep_until(t_ns: int, stopping: Callable[[], bool] = lambda: False,
                      clock: Callable[[], int] = time.monotonic_ns) -> bool:
    """Sleep until ``t_ns`` (``clock``: ``now_ns``'s); True when ``stopping()`` became true meanwhile. uvloop's
    timers have 1 ms resolution and wake up to a millisecond early: the rest is slept again, so nothing
    scheduled for ``t_ns`` starts before it (a replayed request's schedule lag is never negative, a think time
    is whole)."""
    while (left := t_ns - clock()) > 0:
        await asyncio.sleep(left / 1e9)
        if stopping():
            return True
    return False

_TEXT = b'"text":"'
_CONTENT = b'"content":"'
_TEXT_EMPTY = _TEXT + b'"'  # an empty content string: not a token
_CONTENT_EMPTY = _CONTENT + b'"'
_REASONING = (b'"reasoning_content":"', b'"reasoning":"')
_FINISH = b'"finish_reason":"'
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
_MAX_ERROR_BODY = 2048
# a plain call's answer (HttpClient.request: /tokenize, /v1/models) is the caller's data, kept whole up to this;
# a stream's non-SSE answer is an error, kept to _MAX_ERROR_BODY (a /tokenize of a 600-token prompt is ~4 KB)
_MAX_PLAIN_BODY = 8 << 20


@dataclass(slots=True)
class StreamResult:
    """Everything the client saw of one streamed request (times: CLOCK_MONOTONIC ns)."""

    sent_ns: int = 0
    headers_ns: int | None = None
    end_ns: int = 0
    status: int | None = None
    t_ns: list[int] = field(default_factory=list)  # content chunks only
    tok: list[int] = field(default_factory=list)  # tokens per content chunk
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False  # saw data: [DONE]
    error: str | None = None  # category, see docs/metrics.md
    error_detail: str | None = None
    text: list[str] | None = None  # only when text is stored
    # the output's token ids, where the server streams them (vLLM's return_token_ids; the quality guard's hash)
    token_ids: list[int] | None = None
    token_ids_bad: bool = False  # a chunk's token_ids were not a list of integers: none are kept
    cum_tokens: int = 0  # last cumulative usage.completion_tokens seen on a content chunk
    body: bytes = b""  # the body of a non-SSE response (first 2 KiB)
    retry_after_s: float | None = None  # the response's Retry-After, in seconds (429/503)
    body_bytes: int = 0  # the response body's bytes as they arrived (chunked framing included)

    @property
    def ok(self) -> bool:
        return self.error is None


def retry_after_s(value: str) -> float | None:
    """A Retry-After header value (delta-seconds or an HTTP date) in seconds from now; None if unreadable."""
    v = value.strip()
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime

        return max(0.0, parsedate_to_datetime(v).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def status_category(status: int) -> str:
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"


def _has_finish(choices: Any) -> bool:
    """A chunk whose choices carry a finish reason: the last content chunk of a stream."""
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


class SseConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; parses one response (chunked or not, SSE or not) at a time."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.buf = bytearray()
        self.sse = bytearray()
        self.res: StreamResult | None = None
        self.fut: asyncio.Future[None] | None = None
        self.got_bytes = False
        self.last_ns = 0
        self.deadline_ns = 0
        self.retry = False
        self.expect_sse = True
        self.content_type = ""
        self._reset_parser()
        # a chunked body ended at its 0-size chunk before the CRLF that closes it arrived (llama-server sends it
        # in a segment of its own): that CRLF belongs to the finished response, not to the next one
        self.trailer = False

    def _reset_parser(self) -> None:
        self.head_done = False
        self.chunked = False
        self.remaining = -1  # content-length left; -1: until close (or chunked)
        self.chunk_left = 0  # bytes left in the current HTTP chunk, -1 while reading a size line
        self.keep_alive = True
        self.is_sse = False
        self.body = bytearray()  # non-SSE body (errors, JSON)
        self.store_text = False

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client.rx_pending:
            self.client.drain_rx(budget=False)  # bytes that arrived before the close come first
        self.closed = True
        if self.res is not None and self.fut is not None and not self.fut.done():
            if self.head_done and not self.chunked and self.remaining < 0:
                self._finish_body(now_ns())  # body delimited by close
            elif not self.got_bytes:
                self._fail("reset", f"connection closed before any response byte ({exc or 'EOF'})", retry=True)
            else:
                self._fail("reset", f"connection closed mid-response ({exc or 'EOF'})")

    def data_received(self, data: bytes) -> None:
        # Stamp now, parse on the next loop turn (HttpClient.drain_rx, one callback per turn for all
        # connections). When many sockets become readable in one poll (a closed loop's synchronized wave:
        # hundreds of first chunks at once) every stamp is then taken before any parsing, so the last
        # socket's stamp is not late by the parsing of all the others. Pieces of one connection are parsed
        # in arrival order, each with its own stamp.
        t = now_ns()
        self.last_ns = t
        client = self.client
        client.rx_pending.append((self, t, data))
        if not client.rx_scheduled:
            client.schedule_rx()

    def _on_data(self, data: bytes, t: int) -> None:
        if self.trailer:
            if data.startswith(b"\r\n"):
                data = data[2:]
                self.trailer = False
            elif data == b"\r":
                return  # half of it; the "\n" follows
            elif data.startswith(b"\n"):
                data = data[1:]
                self.trailer = False
            else:
                self.trailer = False
            if not data:
                return
        if self.res is None:
            return
        self.got_bytes = True
        if self.head_done:
            self._body(data, t)
            return
        self.buf += data
        idx = self.buf.find(b"\r\n\r\n")
        if idx < 0:
            if len(self.buf) > 65536:
                self._fail("malformed_sse", "response header larger than 64 KiB")
            return
        head = bytes(self.buf[:idx]).decode("latin-1")
        rest = bytes(self.buf[idx + 4:])
        self.buf.clear()
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            self._fail("malformed_sse", f"not an HTTP response: {lines[0][:80]!r}")
            return
        status = int(parts[1])
        if status == 100:
            self.buf += rest
            return
        hdrs: dict[str, str] = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        res = self.res
        res.status = status
        res.headers_ns = t
        self.head_done = True
        self.chunked = "chunked" in hdrs.get("transfer-encoding", "").lower()
        cl = hdrs.get("content-length")
        self.remaining = int(cl) if cl and cl.isdigit() and not self.chunked else -1
        conn_hdr = hdrs.get("connection", "").lower()
        self.keep_alive = conn_hdr != "close" and parts[0] != "HTTP/1.0"
        self.is_sse = status == 200 and "text/event-stream" in hdrs.get("content-type", "")
        self.content_type = hdrs.get("content-type", "?")
        if status != 200 and "retry-after" in hdrs:
            res.retry_after_s = retry_after_s(hdrs["retry-after"])
        if rest:
            self._body(rest, t)
        elif self.remaining == 0:
            self._finish_body(t)

    # -- body framing ----------------------------------------------------------------------------
    def _body(self, data: bytes, t: int) -> None:
        if self.res is not None:
            self.res.body_bytes += len(data)
        if not self.chunked:
            if self.remaining >= 0:
                if len(data) >= self.remaining:
                    data = data[: self.remaining]
                    self.remaining = 0
                else:
                    self.remaining -= len(data)
            self._payload(data, t)
            if self.remaining == 0 and self.fut is not None and not self.fut.done():
                self._finish_body(t)
            return
        buf = self.buf
        if (not buf and self.chunk_left == 0 and self.is_sse and not self.sse and not self.store_text
                and data.endswith(b"\n\n\r\n") and self._whole_chunks_fast(data, t)):
            return
        if buf:  # a partial size line or chunk from the previous read
            buf += data
            data = bytes(buf)
            buf.clear()
        pos = 0
        n = len(data)
        left = self.chunk_left
        payload = self._payload
        while pos < n:
            if left == 0:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    break
                try:
                    size = int(data[pos:eol], 16)
                except ValueError:
                    size_txt = data[pos:eol].split(b";", 1)[0].strip()
                    try:
                        size = int(size_txt, 16)
                    except ValueError:
                        self._fail("malformed_sse", f"bad chunk size line {size_txt[:40]!r}")
                        return
                pos = eol + 2
                if size == 0:
                    self.chunk_left = 0
                    closed = data[pos:pos + 2] == b"\r\n"
                    self._finish_body(t)
                    self.trailer = not closed
                    return
                end = pos + size
                if end + 2 <= n:  # the whole chunk and its CRLF are here (the usual case)
                    payload(data[pos:end], t)
                    if self.res is None:
                        return
                    pos = end + 2
                    continue
                left = size
            elif left > 0:
                take = min(left, n - pos)
                payload(data[pos:pos + take], t)
                if self.res is None:
                    return
                pos += take
                left -= take
                if left == 0:
                    left = -2  # expect the CRLF after the data
            else:  # -2: the CRLF after a chunk's data
                if n - pos < 2:
                    break
                pos += 2
                left = 0
        self.chunk_left = left
        if pos < n:
            buf += data[pos:]

    def _whole_chunks_fast(self, data: bytes, t: int) -> bool:
        """A read made of whole chunks that are all plain one-line content events (the bulk of a stream):
        counted with a few C-level scans instead of one Python step per event. Anything else (a role or
        usage chunk, a finish reason, [DONE], an error, an uneven token count) returns False and the read
        takes the event-by-event path."""
        k = data.count(b"data: ")
        if k == 0 or data.count(b"\n\n\r\n") != k or b'"finish_reason":"' in data or b"[DONE]" in data:
            return False
        n_text = data.count(_TEXT)
        if n_text == k:
            empty = _TEXT_EMPTY
        elif n_text == 0 and data.count(_CONTENT) == k:
            empty = _CONTENT_EMPTY
        else:
            return False
        if empty in data or b'"error"' in data:
            return False
        res = self.res
        assert res is not None
        if self.client.continuous_usage:
            j = data.rfind(b'"completion_tokens":')
            # j < 0: the server accepted continuous_usage_stats but sends no usage on content chunks; each
            # chunk then counts as one token, as in the event-by-event path
            if j >= 0:
                m = _COMPLETION_TOKENS.match(data, j)
                if (m is None or int(m.group(1)) - res.cum_tokens != k
                        or data.count(b'"completion_tokens":') != k):
                    return False  # some chunk carries several tokens: count them one by one
                res.cum_tokens += k
        if k == 1:  # a read of one chunk: the usual case when tokens come slower than the client reads
            res.t_ns.append(t)
            res.tok.append(1)
        else:
            res.t_ns.extend([t] * k)
            res.tok.extend([1] * k)
        return True

    def _payload(self, data: bytes, t: int) -> None:
        if not self.is_sse:
            limit = _MAX_ERROR_BODY if self.expect_sse else _MAX_PLAIN_BODY
            if len(self.body) < limit:
                self.body += data[: limit - len(self.body)]
            return
        sse = self.sse
        if not sse and data.startswith(b"data: {") and data.endswith(b"}\n\n") and data.find(b"\n") == len(data) - 2:
            self._json_event(data[6:-2], t)  # one complete single-line event: the usual case
            return
        sse += data
        if b"\r" in data:
            sse[:] = sse.replace(b"\r\n", b"\n")
        start = 0
        find = sse.find
        while True:
            i = find(b"\n\n", start)
            if i < 0:
                break
            self._event(bytes(sse[start:i]), t)
            start = i + 2
            if self.res is None:
                return
        if start:
            del sse[:start]

    def _event(self, ev: bytes, t: int) -> None:
        """One SSE event (without its blank-line terminator)."""
        res = self.res
        assert res is not None
        if ev.startswith(b"data: "):
            payload = ev[6:]
            if b"\n" in payload:
                payload = self._join_data(ev)
        elif ev.startswith(b"data:"):
            payload = ev[5:]
            if b"\n" in payload:
                payload = self._join_data(ev)
        elif ev.startswith(b":") or not ev:
            return  # comment / keep-alive
        else:
            payload = self._join_data(ev)
            if not payload:
                return  # only event:/id:/retry: lines
        if payload == b"[DONE]":
            res.done = True
            return
        self._json_event(payload, t)

    def _json_event(self, payload: bytes, t: int) -> None:
        if not self.store_text:
            i = payload.find(_TEXT)
            if i < 0:
                i = payload.find(_CONTENT)
                if i >= 0:
                    i += 11
                else:
                    for key in _REASONING:
                        i = payload.find(key)
                        if i >= 0:
                            i += len(key)
                            break
            else:
                i += 8
            if i >= 0 and not (b'"usage":{' in payload and payload.find(_FINISH) >= 0):
                # (a finishing chunk with usage, llama.cpp's last one, takes the full parse below)
                if payload[i] != 34:  # non-empty string value: a content chunk
                    self._content_chunk(payload, t)  # takes the finish reason too
                elif payload.find(_FINISH, i) >= 0:
                    self._finish_reason(payload)
                return
        self._slow_event(payload, t)

    def _join_data(self, ev: bytes) -> bytes:
        parts = []
        for line in ev.split(b"\n"):
            if line.startswith(b"data:"):
                v = line[5:]
                parts.append(v[1:] if v.startswith(b" ") else v)
            elif line.startswith(b":") or line.startswith((b"event:", b"id:", b"retry:")):
                continue
            else:
                self._fail("malformed_sse", f"unexpected line in event stream: {line[:60]!r}")
                return b""
        return b"\n".join(parts)

    def _content_chunk(self, payload: bytes, t: int) -> None:
        res = self.res
        assert res is not None
        n = 1
        if self.client.continuous_usage:
            m = _COMPLETION_TOKENS.search(payload)
            if m is not None:
                cum = int(m.group(1))
                n = max(1, cum - res.cum_tokens)
                res.cum_tokens = cum
        res.t_ns.append(t)
        res.tok.append(n)
        if payload.find(_FINISH) >= 0:
            self._finish_reason(payload)

    def _finish_reason(self, payload: bytes) -> None:
        assert self.res is not None
        i = payload.find(_FINISH) + len(_FINISH)
        j = payload.find(b'"', i)
        self.res.finish_reason = payload[i:j].decode("utf-8", "replace")

    def _slow_event(self, payload: bytes, t: int) -> None:
        res = self.res
        assert res is not None
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._fail("malformed_sse", f"event data is not JSON: {payload[:60]!r}")
            return
        if not isinstance(obj, dict):
            self._fail("malformed_sse", f"event data is not a JSON object: {payload[:60]!r}")
            return
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message", err) if isinstance(err, dict) else err
            # kept whole up to the body limit: the load probe redacts and cuts it to an excerpt before storing
            self._fail("http_5xx", f"error event in stream: {str(msg)[:_MAX_ERROR_BODY]}")
            return
        usage = obj.get("usage")
        choices = obj.get("choices")
        if isinstance(usage, dict) and (not choices or _has_finish(choices)):
            # vLLM sends usage in a chunk of its own (no choices); llama.cpp in the finishing chunk itself
            res.usage = usage
        if not isinstance(choices, list):
            if usage is None:
                self._fail("malformed_sse", f"event has no choices: {payload[:60]!r}")
            return
        for ch in choices:
            if not isinstance(ch, dict):
                continue
            d = ch.get("delta")
            delta: dict[str, Any] = d if isinstance(d, dict) else ch
            text = delta.get("text") or delta.get("content") or delta.get("reasoning_content") \
                or delta.get("reasoning")
            ids = ch.get("token_ids")
            if ids is not None and self.store_text and not res.token_ids_bad:
                # a chunk's token ids (vLLM with return_token_ids: the delta's, text or not); one malformed
                # list drops them all, and the output is then hashed by its text
                if isinstance(ids, list) and all(type(x) is int for x in ids):
                    if res.token_ids is None:
                        res.token_ids = []
                    res.token_ids.extend(ids)
                else:
                    res.token_ids, res.token_ids_bad = None, True
            if text:
                if self.store_text:
                    if res.text is None:
                        res.text = []
                    res.text.append(str(text))
                self._content_chunk(payload, t)
            if ch.get("finish_reason"):
                res.finish_reason = str(ch["finish_reason"])

    # -- completion --------------------------------------------------------------------------
    def _finish_body(self, t: int) -> None:
        res = self.res
        if res is None:
            return
        res.end_ns = t
        status = res.status or 0
        if not self.is_sse:
            res.body = bytes(self.body)
        if not self.expect_sse:
            pass  # a plain call: the caller reads status and body
        elif status != 200:
            # the whole kept body (2 KiB): the load probe redacts it, then keeps an excerpt (diagnose.capture.redact)
            detail = bytes(self.body).decode("utf-8", "replace").strip().replace("\n", " ")
            res.error = status_category(status)
            res.error_detail = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
        elif not self.is_sse:
            res.error = "malformed_sse"
            res.error_detail = f"response is not an event stream (content-type {self.content_type})"
        elif self.is_sse and not res.done and res.finish_reason is None:
            res.error = "malformed_sse"
            res.error_detail = "stream ended without data: [DONE] or a finish_reason"
        self._complete(reusable=self.keep_alive and res.error not in ("malformed_sse",))

    def _fail(self, category: str, detail: str, retry: bool = False) -> None:
        res = self.res
        if res is None:
            return
        res.error = category
        res.error_detail = detail
        res.end_ns = now_ns()
        self.retry = retry
        self._complete(reusable=False)

    def _complete(self, reusable: bool) -> None:
        fut = self.fut
        self.res = None
        self.fut = None
        self.buf.clear()
        self.sse.clear()
        self._reset_parser()
        if not reusable:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        if fut is not None and not fut.done():
            fut.set_result(None)
        if reusable:
            self.client._release(self)
