"""A throw-away PostgreSQL cluster for the tests: ``initdb`` and ``pg_ctl`` on a free port.

The server binaries come from ``pg_config --bindir`` or Debian's
``/usr/lib/postgresql/<version>/bin`` (``make test`` installs the ``postgresql``
package when it runs as root and the package is missing).  The cluster lives in
a fresh temporary folder, listens on 127.0.0.1 only, keeps its socket in that
folder, and is removed when the test session ends.  PostgreSQL refuses to run
as root, so under root the server runs as the ``postgres`` system user.

Each test gets a database of its own (:meth:`PgCluster.fresh_database`), so
tests never see each other's rows.  Under pytest-xdist each worker is a pytest
session of its own and so starts a cluster of its own, in its own folder, on a
port outside the kernel's ephemeral range (:func:`free_port`): the workers
share nothing.
"""

from __future__ import annotations

import itertools
import os
import pwd
import random
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SUPERUSER = "switchboard"


def find_bindir() -> Path | None:
    """Where initdb and pg_ctl are, or None when no PostgreSQL server is installed."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))

    def version(path: Path) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in path.parent.name.split("."))
        except ValueError:
            return (0,)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def why_unavailable() -> str | None:
    """The reason PostgreSQL tests cannot run here, or None when they can."""
    if find_bindir() is None:
        return (
            "no PostgreSQL server binaries (initdb, pg_ctl) via pg_config or /usr/lib/postgresql/*/bin; "
            "`make test` installs Debian's postgresql package when run as root"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' system user to run the server as"
    return None


def _ephemeral_ports() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A port free now, outside the kernel's ephemeral range: a socket bound to port 0 (every fake
    server, every test in another pytest-xdist worker) is never handed it, so a server started on it
    later, or started again on it after a stop, finds it still free."""
    ephemeral = _ephemeral_ports()
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(10000, ephemeral.start) if ephemeral.start > 11000 else pick.randrange(1024, 65536)
        if port in ephemeral:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("found no free port below the ephemeral range in 200 tries")


def started_or_skip() -> Iterator[PgCluster]:
    """A fixture's body: a throw-away server for its scope, stopped afterwards; the test skips, saying
    why, where none can be started."""
    import pytest

    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = PgCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass
class PgCluster:
    """One running server; :meth:`url` gives a libpq URL for one of its databases."""

    bindir: Path
    datadir: Path
    port: int
    password: str
    _run_as: str | None
    _options: str = ""
    _names = itertools.count(1)

    @classmethod
    def start(cls, settings: dict[str, str] | None = None) -> PgCluster:
        """Initialise and start a cluster; ``settings`` override the server's (``fsync=off`` for tests)."""
        reason = why_unavailable()
        if reason:
            raise RuntimeError(reason)
        bindir = find_bindir()
        assert bindir is not None
        run_as = "postgres" if os.geteuid() == 0 else None
        # one cluster per pytest process: each pytest-xdist worker (gw0, gw1, ...) starts its own
        root = Path(tempfile.mkdtemp(prefix=f"switchboard-pg-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"))
        if run_as:
            entry = pwd.getpwnam(run_as)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        password = secrets.token_urlsafe(16)
        pwfile = root / "pw"
        pwfile.write_text(password + "\n")
        if run_as:
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        datadir = root / "data"
        cluster = cls(bindir=bindir, datadir=datadir, port=free_port(), password=password, _run_as=run_as)
        cluster._run(
            "initdb",
            "-D", str(datadir),
            "-U", SUPERUSER,
            "--pwfile", str(pwfile),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        server = {"listen_addresses": "127.0.0.1", "fsync": "off", "max_connections": "200", **(settings or {})}
        for attempt in range(5):  # another process may take the port between free_port() and the server's bind
            cluster._options = f"-p {cluster.port} -k {root} " + " ".join(f"-c {k}={v}" for k, v in server.items())
            try:
                cluster.start_server()
                return cluster
            except RuntimeError as exc:
                if attempt == 4 or "could not bind" not in str(exc) and "already in use" not in str(exc):
                    raise
                cluster.port = free_port()
        raise AssertionError("unreachable")

    def start_server(self) -> None:
        """Start the server (again, after :meth:`stop_server`); returns once it accepts connections."""
        log = self.datadir.parent / "server.log"
        self._run("pg_ctl", "-D", str(self.datadir), "-o", self._options, "-l", str(log), "-w", "start")

    def stop_server(self) -> None:
        """Stop the server (fast shutdown: its sessions are ended), keeping the cluster for :meth:`start_server`."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        """Stop and start the server, as an operator's restart or a failover does: every open connection ends."""
        self.stop_server()
        self.start_server()

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run(
            [str(self.bindir / tool), *args], capture_output=True, text=True, check=False, user=self._run_as
        )
        if out.returncode != 0:
            log = self.datadir.parent / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed ({out.returncode}): {out.stderr.strip()}\n{tail}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self, template: str | None = None) -> str:
        """Create a database (empty, or a copy of the database ``template``) and return its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            for attempt in range(50):
                try:
                    conn.execute(f'CREATE DATABASE "{name}"{copy}')
                    break
                except psycopg.errors.ObjectInUse:  # the template's last session is still closing
                    if attempt == 49:
                        raise
                    time.sleep(0.05)
        return self.url(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.datadir.parent, ignore_errors=True)
