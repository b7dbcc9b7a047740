"""A TCP relay in front of a real server that cuts connections as a network or a crashing server would.

    relay = CuttingRelay(upstream_port=imap.port); await relay.start()   # 127.0.0.1, port 0
    # point the client at relay.port instead of the server's
    relay.cut()                        # every relayed connection reset now: no BYE, no answer
    relay.refuse = True                # new connections accepted and closed at once (the server unreachable)
    relay.cut_before(b"UID STORE")     # the client's next command holding this never reaches the server
    relay.cut_after(b"UID STORE")      # it reaches the server, whose answer never reaches the client
    relay.sent                         # every chunk the clients sent, in order (to count commands)

It speaks no protocol of its own: the server behind it (Dovecot, for the email tests) checks
everything it checks, and the faults land exactly between two protocol steps, which a kill of the
server could not aim at.  ``refused_at`` holds the time of every refused connection, so a test can
see a client's reconnect backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class _Pair:
    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter):
        self.client = client
        self.server = server
        self.swallow_answer = False  # cut when the server's next answer arrives, without passing it on

    def abort(self) -> None:
        for writer in (self.client, self.server):
            with contextlib.suppress(Exception):
                writer.transport.abort()


class CuttingRelay:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.refuse = False
        self.accepted = 0  # connections relayed to the server
        self.refused_at: list[float] = []  # time.monotonic() of each refused connection
        self.cuts = 0  # connections cut by a scripted fault
        self.sent: list[bytes] = []  # what the clients sent, chunk by chunk
        self._pairs: set[_Pair] = set()
        self._before: list[bytes] = []
        self._after: list[bytes] = []
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> "CuttingRelay":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> "CuttingRelay":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- faults ---------------------------------------------------------------------------

    def cut(self) -> int:
        """Reset every relayed connection now; how many there were."""
        pairs = list(self._pairs)
        for pair in pairs:
            pair.abort()
        self._pairs.clear()
        self.cuts += len(pairs)
        return len(pairs)

    def cut_before(self, pattern: bytes) -> None:
        """The next client chunk holding ``pattern`` is dropped and its connection reset."""
        self._before.append(pattern)

    def cut_after(self, pattern: bytes) -> None:
        """The next client chunk holding ``pattern`` reaches the server; its answer is dropped and the connection reset."""
        self._after.append(pattern)

    def count(self, pattern: bytes) -> int:
        """How many client chunks held ``pattern`` (``b"UID fetch 3 "``: how often mail 3 was fetched)."""
        return sum(1 for chunk in self.sent if pattern.lower() in chunk.lower())

    # -- relaying -------------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            self.refused_at.append(time.monotonic())
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        self._spawn(self._pump_up(pair, reader))
        self._spawn(self._pump_down(pair, up_reader))

    def _take(self, patterns: list[bytes], chunk: bytes) -> bool:
        for index, pattern in enumerate(patterns):
            if pattern.lower() in chunk.lower():
                del patterns[index]
                return True
        return False

    async def _pump_up(self, pair: _Pair, reader: asyncio.StreamReader) -> None:
        try:
            while chunk := await reader.read(65536):
                self.sent.append(chunk)
                if self._take(self._before, chunk):
                    self.cuts += 1
                    self._pairs.discard(pair)
                    pair.abort()
                    return
                if self._take(self._after, chunk):
                    pair.swallow_answer = True
                pair.server.write(chunk)
                await pair.server.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._pairs.discard(pair)
            pair.abort()

    async def _pump_down(self, pair: _Pair, reader: asyncio.StreamReader) -> None:
        try:
            while chunk := await reader.read(65536):
                if pair.swallow_answer:
                    self.cuts += 1
                    return
                pair.client.write(chunk)
                await pair.client.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._pairs.discard(pair)
            pair.abort()
