"""The SSE response parser fed byte by byte, in batches and in odd splits: the same records every way."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from diagnose.probes.http_client import HttpClient
from diagnose.probes.sse import SseConnection, StreamResult

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(text: str, cum: int | None, finish: str | None = None, chat: bool = False) -> bytes:
    choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
              else {"index": 0, "text": text, "finish_reason": finish})
    obj: dict[str, object] = {"id": "x", "choices": [choice]}
    if cum is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": cum, "total_tokens": cum + 3}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def stream(tokens: list[int], cont: bool, chat: bool = False) -> list[bytes]:
    """One HTTP chunk per event: a role chunk (chat), content chunks carrying ``tokens[i]`` tokens, usage, DONE."""
    out = []
    if chat:
        out.append(chunk(b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'))
    cum = 0
    for i, k in enumerate(tokens):
        cum += k
        last = i == len(tokens) - 1
        out.append(chunk(event(" a" * k, cum if cont else None, "length" if last else None, chat)))
    out.append(chunk(b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % cum))
    out.append(chunk(b"data: [DONE]\n\n"))
    out.append(b"0\r\n\r\n")
    return out


def feed(pieces: list[bytes], cont: bool, reads: str) -> StreamResult:
    async def go() -> StreamResult:
        client = HttpClient("http://127.0.0.1:1")
        client.continuous_usage = cont
        conn = SseConnection(client)
        res = StreamResult()
        conn.res, conn.fut = res, asyncio.get_running_loop().create_future()
        body = b"".join(pieces)
        if reads == "per-chunk":
            parts = [HEAD, *pieces]
        elif reads == "batched":
            parts = [HEAD] + [b"".join(pieces[i:i + 8]) for i in range(0, len(pieces), 8)]
        elif reads == "bytewise":
            parts = [HEAD] + [body[i:i + 1] for i in range(len(body))]
        else:  # odd splits that cut size lines, events and CRLFs
            raw = HEAD + body
            parts = [raw[i:i + 37] for i in range(0, len(raw), 37)]
        for p in parts:
            conn.data_received(p)
        # bytes are stamped on arrival and parsed from the next loop turn on, a budget per turn
        for _ in range(len(parts) + 1):
            await asyncio.sleep(0)
            if not client.rx_pending:
                break
        assert not client.rx_pending
        assert conn.fut is None  # the response finished
        return res

    return asyncio.run(go())


@pytest.mark.parametrize("reads", ["per-chunk", "batched", "bytewise", "odd"])
@pytest.mark.parametrize("cont", [True, False])
def test_same_records_however_the_bytes_arrive(reads: str, cont: bool) -> None:
    tokens = [1] * 20 + [3] + [1] * 10 + [2, 1]
    res = feed(stream(tokens, cont), cont, reads)
    assert res.ok and res.done and res.finish_reason == "length" and res.status == 200
    assert len(res.t_ns) == len(tokens)
    assert res.tok == (tokens if cont else [1] * len(tokens))  # exact with continuous usage, else 1 per chunk
    assert res.usage == {"prompt_tokens": 3, "completion_tokens": sum(tokens)}


@pytest.mark.parametrize("reads", ["per-chunk", "batched", "odd"])
def test_chat_role_chunk_is_not_content(reads: str) -> None:
    res = feed(stream([1] * 30, True, chat=True), True, reads)
    assert res.ok and len(res.t_ns) == 30 and sum(res.tok) == 30


def test_batched_read_shares_its_timestamp_and_keeps_order() -> None:
    res = feed(stream([1] * 24, True), True, "batched")
    assert res.t_ns == sorted(res.t_ns)
    assert len(set(res.t_ns)) <= 5  # 24 content events in 4-5 reads


def test_continuous_usage_accepted_but_absent_takes_the_fast_path() -> None:
    """A server that accepts stream_options.continuous_usage_stats but sends no usage on content chunks (the
    truth server, older engines): each chunk is one token, counted by the whole-read fast path rather than
    falling through to the event-by-event parser on every read (the cost that made the client lag)."""
    async def go() -> tuple[StreamResult, int]:
        client = HttpClient("http://127.0.0.1:1")
        client.continuous_usage = True
        conn = SseConnection(client)
        res = StreamResult()
        conn.res, conn.fut = res, asyncio.get_running_loop().create_future()
        slow = 0
        orig = conn._payload

        def counting(data: bytes, t: int) -> None:
            nonlocal slow
            slow += 1
            orig(data, t)

        conn._payload = counting  # type: ignore[method-assign]
        for p in [HEAD, *stream([1] * 20, cont=False)]:
            conn.data_received(p)
        await asyncio.sleep(0)
        return res, slow

    res, slow = asyncio.run(go())
    assert res.ok and res.tok == [1] * 20 and len(res.t_ns) == 20
    assert slow == 3  # only the finishing chunk, the usage chunk and [DONE]


def test_a_server_that_closes_after_each_stream_loses_no_request() -> None:
    """llama-server writes a chunked body's closing CRLF in a segment of its own, then closes the connection
    although its headers say Keep-Alive. That CRLF belongs to the finished response (it once made the next
    request on the pooled connection fail as 'closed mid-response', 13% of requests at c=8); a reuse that
    finds the connection closed is retried on a fresh one, and after a few the client stops pooling."""
    from diagnose.probes.http_client import REUSE_FAILURES_MAX

    served = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        await reader.readexactly(n)
        served.append(1)
        writer.write(HEAD.replace(b"\r\n\r\n", b"\r\nKeep-Alive: timeout=5, max=100\r\n\r\n")
                     + b"".join(stream([1, 1], cont=False)[:-1]) + b"0\r\n")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"\r\n")  # the closing CRLF, late
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.close()

    async def go() -> tuple[list[StreamResult], int]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpClient(f"http://127.0.0.1:{port}")
        out = []
        for _ in range(REUSE_FAILURES_MAX + 3):
            out.append(await client.stream("/v1/completions", b"{}", StreamResult()))
            await asyncio.sleep(0.01)  # the next request goes out before the server's close arrives
        await client.close()
        server.close()
        return out, client.reuse_failures

    results, failures = asyncio.run(go())
    assert [r.error for r in results] == [None] * len(results), [r.error_detail for r in results]
    assert all(r.done and r.finish_reason == "length" for r in results)
    assert failures == REUSE_FAILURES_MAX  # then no more reuse: nothing more to retry
    assert len(served) == len(results)  # each request served once (a retry only after the server closed)


def test_a_plain_request_on_a_pooled_connection_the_server_closed_is_sent_again() -> None:
    """An engine test (stop 43): one of six /tokenize calls to llama-server failed in 2 ms and its prompt was
    estimated, not measured. The call went out on a pooled connection the server was closing after a streamed
    response (as llama-server does); ``stream`` sent such a request again on a fresh connection, ``request``
    did not. Now both do, once, and only when the server closed before any byte of the answer. The server here
    answers one request a connection and closes the connection when a second arrives on it."""
    served = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        await reader.readexactly(n)
        served.append(head.split(b" ")[1])
        if head.startswith(b"POST /v1/completions"):
            writer.write(HEAD.replace(b"\r\n\r\n", b"\r\nKeep-Alive: timeout=5, max=100\r\n\r\n")
                         + b"".join(stream([1, 1], cont=False)))
        else:
            body = b'{"count": 7}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")  # a second request on this connection: closed unanswered
        writer.close()

    async def go() -> tuple[list[tuple[int, bytes]], int]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpClient(f"http://127.0.0.1:{port}")
        out = []
        assert (await client.stream("/v1/completions", b"{}", StreamResult())).ok
        for _ in range(2):
            out.append(await client.request("POST", "/tokenize", {"prompt": "x"}))
        await client.close()
        server.close()
        return out, client.reuse_failures

    answers, failures = asyncio.run(go())
    assert answers == [(200, b'{"count": 7}')] * 2
    assert failures == 2  # each /tokenize found its pooled connection closed and went out again
    assert served == [b"/v1/completions", b"/tokenize", b"/tokenize"]  # each request served once


def test_usage_in_the_finishing_chunk_is_kept() -> None:
    """llama.cpp sends usage in the chunk that carries the finish reason (with ``timings``), not in a chunk of
    its own: the request's served output tokens come from it (a context-cut output is shorter than asked)."""
    pieces = [chunk(event(" a", None)) for _ in range(5)]
    final = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "id": "x",
             "usage": {"completion_tokens": 55, "prompt_tokens": 201, "total_tokens": 256},
             "timings": {"prompt_n": 201, "prompt_ms": 16.9, "predicted_n": 55}}
    pieces += [chunk(b"data: " + json.dumps(final).encode() + b"\n\n"), chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    res = feed(pieces, False, "per-chunk")
    assert res.ok and res.finish_reason == "length"
    assert res.usage == {"completion_tokens": 55, "prompt_tokens": 201, "total_tokens": 256}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_plain_answer_is_kept_whole(chunked: bool) -> None:
    """HttpClient.request (/tokenize, /v1/models) returns the caller's data: kept whole, not cut to the 2 KiB a
    stream's error body keeps (vLLM's /tokenize of a 600-token prompt is ~4 KB of JSON: cut, it did not parse,
    and the prompt's token count was lost)."""
    body = json.dumps({"count": 1500, "max_model_len": 2048, "tokens": list(range(1500))}).encode()
    assert len(body) > 4096

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        await reader.readexactly(n)
        if chunked:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(body), 1000):
                part = body[i:i + 1000]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
        await writer.drain()
        writer.close()

    async def go() -> tuple[int, bytes]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpClient(f"http://127.0.0.1:{port}")
        try:
            return await client.request("POST", "/tokenize", {"prompt": "x"})
        finally:
            await client.close()
            server.close()

    status, got = asyncio.run(go())
    assert status == 200 and got == body
    assert len(json.loads(got)["tokens"]) == 1500
