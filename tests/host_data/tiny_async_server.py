"""A tiny asyncio HTTP server for `diagnose run` tests: prints its port, answers each request after some
CPU work in ``handle`` (so the profile has a known hot function)."""

import asyncio
import sys


def busy_work() -> int:
    return sum(i * i for i in range(100_000))


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    body = str(busy_work()).encode()
    writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    writer.close()


async def main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
