"""systemd's notification protocol (sd_notify), spoken directly: one datagram per message.

Without ``NOTIFY_SOCKET`` every call is a no-op, so the daemon runs the same
under systemd, in a terminal and in tests.  ``WATCHDOG_USEC`` sets the
interval; :func:`watchdog_interval` returns half of it (when to ping).

A reload follows ``Type=notify-reload``'s protocol (also understood by
``Type=notify`` units with ``ExecReload=``): :meth:`Notifier.reloading` sends
``RELOADING=1`` with ``MONOTONIC_USEC`` (the CLOCK_MONOTONIC time it started,
in microseconds), and ``READY=1`` follows when the reload is over, applied or
not.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET") or None
        if address and address.startswith("@"):
            address = "\0" + address[1:]  # abstract namespace
        self._address = address
        self._sock: socket.socket | None = None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        self._watchdog_usec = int(usec) if usec and usec.isdigit() and (not pid or pid == str(os.getpid())) else 0

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half the configured interval), or None."""
        return self._watchdog_usec / 2e6 if self._watchdog_usec and self.enabled else None

    def reloading(self, status: str = "reloading the config") -> None:
        """``RELOADING=1`` stamped with CLOCK_MONOTONIC (systemd ignores one without the stamp)."""
        self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}", f"STATUS={status}")

    def send(self, *lines: str) -> None:
        if not self._address:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:  # a lost notification must not take the daemon down
            log.warning("sd_notify failed: %s", exc)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares ``MONOTONIC_USEC`` with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
