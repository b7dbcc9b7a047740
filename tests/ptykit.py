"""A program on a pseudo-terminal, as a person at a terminal runs it: keys typed (Ctrl-C included, turned
into SIGINT by the terminal itself), and what the screen received.

The program gets the terminal as its controlling terminal (``setsid --ctty``, util-linux), so the
terminal's line discipline delivers Ctrl-C and Ctrl-D exactly as it does for a user.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import struct
import subprocess
import termios
import threading

import pytest

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")

CTRL_C = "\x03"
CTRL_D = "\x04"


class Terminal:
    def __init__(self, argv: list[str], *, env: dict[str, str], cols: int = 160, rows: int = 40) -> None:
        setsid = shutil.which("setsid")
        if setsid is None:
            pytest.skip("setsid (util-linux) is not installed: apt-get install util-linux")
        self._master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen([setsid, "--ctty", *argv], stdin=slave, stdout=slave, stderr=slave,
                                     env={**env, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)})
        os.close(slave)
        self._received = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="pty-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # the program is gone (EIO)
                return
            if not chunk:
                return
            with self._lock:
                self._received += chunk

    def type(self, keys: str) -> None:
        os.write(self._master, keys.encode())

    def raw(self) -> str:
        with self._lock:
            return self._received.decode("utf-8", errors="replace")

    def text(self) -> str:
        """What was received, without terminal control sequences."""
        return _ESCAPES.sub("", self.raw())

    def wait(self, timeout: float = 30) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s; the screen:\n{self.text()}") from None
        self._reader.join(timeout=5)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        os.close(self._master)
