"""The terminal side of ``switchboard chat``: lines from standard input and Ctrl-C, both on the event loop.

Standard input is read with ``loop.add_reader`` rather than ``input()`` in a thread: a thread blocked
in ``input()`` cannot be told to stop, so Ctrl-C at the prompt could not leave (the interpreter waits
for that thread at exit).  The terminal's own line editing (canonical mode: backspace, Ctrl-U,
Ctrl-W) works as before; ``input()`` gave no more, as no ``readline`` module is loaded.

Ctrl-C (SIGINT) is taken by the loop (``add_signal_handler``) and handed to ``on_interrupt``; the
chat decides what it means (stop the answer, or leave).
"""

from __future__ import annotations

import asyncio
import codecs
import os
import signal
import sys
from typing import Callable


class TerminalInput:
    """Lines typed (or piped) on ``fd``; :meth:`read_line` returns None at end of input or when
    :meth:`leave` was called (Ctrl-C at the prompt)."""

    def __init__(self, fd: int | None = None, *, prompt: str = "") -> None:
        self._fd = sys.stdin.fileno() if fd is None else fd
        self._prompt = prompt
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._eof = False
        self._arrived = asyncio.Event()
        self._leaving = asyncio.Event()

    def leave(self) -> None:
        self._leaving.set()

    @property
    def leaving(self) -> asyncio.Event:
        return self._leaving

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # Ctrl-D at the start of a line, or the pipe's end
            self._eof = True
            self._pending += self._decoder.decode(b"", final=True)
            asyncio.get_running_loop().remove_reader(self._fd)
        else:
            self._pending += self._decoder.decode(chunk)
        self._arrived.set()

    async def read_line(self) -> str | None:
        """The next line without its newline; None at the end of input or once leaving."""
        if self._prompt:
            sys.stdout.write(self._prompt)
            sys.stdout.flush()
        loop = asyncio.get_running_loop()
        if not self._eof:
            loop.add_reader(self._fd, self._readable)
        try:
            while "\n" not in self._pending and not self._eof and not self._leaving.is_set():
                self._arrived.clear()
                arrived = asyncio.ensure_future(self._arrived.wait())
                leaving = asyncio.ensure_future(self._leaving.wait())
                await asyncio.wait({arrived, leaving}, return_when=asyncio.FIRST_COMPLETED)
                arrived.cancel()
                leaving.cancel()
        finally:
            if not self._eof:
                loop.remove_reader(self._fd)
        if self._leaving.is_set():
            return None
        if "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            return line
        if self._pending:  # the last line had no newline
            line, self._pending = self._pending, ""
            return line
        return None


def catch_interrupts(on_interrupt: Callable[[], None]) -> Callable[[], object]:
    """Send Ctrl-C (SIGINT) to ``on_interrupt`` on the running loop; returns the function that undoes it."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    return lambda: loop.remove_signal_handler(signal.SIGINT)
