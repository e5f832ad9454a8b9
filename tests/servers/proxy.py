"""A TCP proxy on loopback that delays every chunk in each direction: a network with a long round trip and a
fast link, between the load client and a test server (the client-vs-server time tests, the probes' round trip)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def delaying_proxy(upstream_port: int, one_way_s: float) -> AsyncIterator[int]:
    """A TCP proxy on loopback that delivers every chunk ``one_way_s`` after it arrived, in order (a network
    with a long round trip and a fast link)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        q: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await q.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        out = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(1 << 16):
                q.put_nowait((time.monotonic() + one_way_s, data))
        except ConnectionError:
            pass
        q.put_nowait((0.0, b""))
        await asyncio.gather(out, return_exceptions=True)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
