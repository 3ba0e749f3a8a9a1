"""A TCP proxy that holds every byte for a fixed time in each direction: link delay where the
kernel has no netem (cluster/README.md). Run on a host in front of its server:

    python delay_proxy.py LISTEN_PORT TARGET_PORT DELAY_S

listens on every address of the host at LISTEN_PORT and forwards each connection to
127.0.0.1:TARGET_PORT; bytes leave DELAY_S after they arrived, in order, so a round trip costs
2 * DELAY_S more and throughput is unchanged. At most QUEUE_CHUNKS chunks wait per direction (then
the sender is slowed down by TCP as a full link would).
"""

from __future__ import annotations

import asyncio
import sys
import time

QUEUE_CHUNKS = 256  # of up to 64 KiB


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)

    async def feed():
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    feeder = asyncio.create_task(feed())
    try:
        while True:
            due, data = await queue.get()
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        feeder.cancel()


async def _serve(listen_port: int, target_port: int, delay: float) -> None:
    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pump(client_reader, server_writer, delay), _pump(server_reader, client_writer, delay),
                             return_exceptions=True)
        for w in (client_writer, server_writer):
            w.close()

    server = await asyncio.start_server(handle, "0.0.0.0", listen_port, backlog=512)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: delay_proxy.py LISTEN_PORT TARGET_PORT DELAY_S")
    listen_port, target_port, delay = int(argv[0]), int(argv[1]), float(argv[2])
    if not 0 <= delay <= 10:
        sys.exit(f"DELAY_S must be 0..10 seconds, got {delay}")
    asyncio.run(_serve(listen_port, target_port, delay))


if __name__ == "__main__":
    main(sys.argv[1:])
