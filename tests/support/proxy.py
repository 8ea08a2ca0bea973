"""A TCP relay on loopback that a test can cut and restore, to simulate a network partition
between a client and etcd (every open connection is reset; new ones are refused), or pause
and resume, to simulate an etcd that stops answering (connections stay open, nothing flows)."""

from __future__ import annotations

import asyncio
import contextlib


class CuttableProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    await self._flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def restore(self) -> None:
        await self.start()

    def pause(self) -> None:
        """Hold every byte in both directions until ``resume``."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()
