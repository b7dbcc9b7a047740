"""The stdio transport of a server: the SDK's, with its reading of the server's output made linear.

The SDK's stdio client (``mcp.client.stdio``) joins what it has read to each new chunk and splits the
whole again, which is quadratic in the length of a line: a 10 MB result took six seconds and held the
event loop for a third of a second at a time.  This one keeps the bytes in one buffer, looks for the
end of a line only in what is new, and reads a long message (over ``THREAD_PARSE_BYTES``) off the
event loop.  And it hands the process exactly the environment it is given, where the SDK's adds
some of the gateway's own (see :mod:`.environment`).  The rest is as the SDK does it: one process in its own session, JSON-RPC messages a line
each, and on close stdin shut, two seconds for the server to go, then SIGTERM and SIGKILL to its group.

One thing more than the SDK: ``on_end`` is told at once when the server's stdout ends or its process
exits (a kill -9, a crash) before the transport is closed, so the client marks the server down then,
not at its next ping.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, TextIO

import anyio
import anyio.to_thread

if TYPE_CHECKING:  # loaded when a stdio server is started (stdio_transport), never at import
    from mcp.shared.message import SessionMessage

THREAD_PARSE_BYTES = 256 * 1024
STOP_SECONDS = 2.0


def _parse(line: bytes) -> SessionMessage | Exception:
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except Exception as exc:  # noqa: BLE001 - handed to the session, which reports it
        return exc


@contextlib.asynccontextmanager
async def stdio_transport(command: str, args: list[str], *, env: dict[str, str], cwd: str | None,
                          errlog: TextIO, on_end: Callable[[str], None] = lambda why: None,
                          ) -> AsyncIterator[tuple[Any, Any]]:
    from mcp.shared.message import SessionMessage

    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        process = await anyio.open_process([command, *args], env=env, stderr=errlog, cwd=cwd,
                                           start_new_session=True)
    except OSError:
        for stream in (read_writer, read_stream, write_stream, write_reader):
            await stream.aclose()
        raise
    closing = False  # our own close ends the output too: that is not the server's end

    def ended(why: str) -> None:
        if not closing:
            on_end(why)

    async def stdout_reader() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with read_writer:
                async for chunk in process.stdout:
                    scan_from = len(buffer)
                    buffer += chunk
                    while (end := buffer.find(b"\n", scan_from)) >= 0:
                        line = bytes(buffer[:end])
                        del buffer[:end + 1]
                        scan_from = 0
                        if not line.strip():
                            continue
                        if len(line) > THREAD_PARSE_BYTES:
                            message = await anyio.to_thread.run_sync(_parse, line)
                        else:
                            message = _parse(line)
                        await read_writer.send(message)
        ended("its output ended")

    async def exit_watcher() -> None:
        code = await process.wait()
        ended(f"its process exited ({_exit_status(code)})")

    async def stdin_writer() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode("utf-8"))

    async with anyio.create_task_group() as tg, process:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        tg.start_soon(exit_watcher)
        try:
            yield read_stream, write_stream
        finally:
            closing = True
            if process.stdin is not None:
                with contextlib.suppress(Exception):
                    await process.stdin.aclose()
            with anyio.move_on_after(STOP_SECONDS, shield=True):
                await process.wait()
            if process.returncode is None:
                _signal_group(process.pid, signal.SIGTERM)
                with anyio.move_on_after(STOP_SECONDS, shield=True):
                    await process.wait()
                if process.returncode is None:
                    _signal_group(process.pid, signal.SIGKILL)
            for stream in (read_stream, write_stream, read_writer, write_reader):
                await stream.aclose()
            tg.cancel_scope.cancel()


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
