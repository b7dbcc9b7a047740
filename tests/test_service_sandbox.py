"""The daemon runs under the system unit's restrictions.

There is no systemd here to start the unit, so these tests do what systemd
would do, in a child process, then run the daemon's code there:

- the seccomp settings, read from the rendered unit (``SystemCallFilter=`` with
  the groups expanded by ``systemd-analyze syscall-filter``,
  ``SystemCallErrorNumber=``, ``RestrictAddressFamilies=``,
  ``MemoryDenyWriteExecute=``), installed with libseccomp (systemd's own
  library) together with ``no_new_privs`` (``NoNewPrivileges=``);
- the file-system settings, as mounts in a new mount namespace (root only):
  ``ProtectSystem=strict`` with ``ReadWritePaths=<home>``,
  ``ProtectHome=read-only``, ``PrivateTmp=``, ``PrivateDevices=``,
  ``ProtectProc=invisible``/``ProcSubset=pid``, ``ProtectKernelTunables=``.

Under them run a workload doing what the daemon does (numpy with BLAS threads,
pydantic-core, aiohttp and yarl, ssl, the openai SDK against the fake model
server, the platform libraries' imports, the real ``SessionDB`` with WAL and
FTS5, name resolution, an sd_notify datagram), and ``switchboard run`` itself
with a fake ``NOTIFY_SOCKET``.  Controls try what each restriction forbids (a
writable+executable mapping, a netlink socket, a refused system call, writes
outside the home) and must be refused, so the tests fail if the emulation
were not in force.

Not emulated (nothing in the daemon goes near them): PrivateUsers=,
PrivateIPC=, ProtectHostname=, ProtectClock=, ProtectKernelModules/Logs=,
ProtectControlGroups=, RestrictNamespaces=, RestrictRealtime=,
RestrictSUIDSGID=, LockPersonality=, the empty CapabilityBoundingSet=.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from ctypes.util import find_library
from pathlib import Path

import pytest

from gateway.runtime.systemd import plan_install

ROOT = Path(__file__).resolve().parent.parent

# Runs in the child: install the filters, then exec argv.  Only the standard library.
LAUNCHER = textwrap.dedent(
    r"""
    import ctypes, json, os, sys

    policy = json.load(open(sys.argv[1]))
    argv = sys.argv[sys.argv.index("--") + 1:]
    lib = ctypes.CDLL(policy["libseccomp"], use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]

    class Cmp(ctypes.Structure):  # struct scmp_arg_cmp
        _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]

    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Cmp)]
    ALLOW = 0x7FFF0000
    ERRNO = lambda e: 0x00050000 | (e & 0xFFFF)
    NE, EQ, GE, MASKED_EQ = 1, 4, 5, 7

    def nr(name):
        n = lib.seccomp_syscall_resolve_name(name.encode())
        return n if n >= 0 else None  # not on this architecture

    def load(default, rules):
        ctx = lib.seccomp_init(default)
        assert ctx, "seccomp_init failed"
        for action, name, cmps in rules:
            n = nr(name)
            if n is None:
                continue
            arr = (Cmp * max(len(cmps), 1))(*[Cmp(*c) for c in cmps])
            rc = lib.seccomp_rule_add_array(ctx, action, n, len(cmps), arr)
            assert rc == 0, f"seccomp_rule_add({name}) = {rc}"
        rc = lib.seccomp_load(ctx)  # sets no_new_privs first, like NoNewPrivileges=yes
        assert rc == 0, f"seccomp_load = {rc}"
        lib.seccomp_release(ctx)

    # RestrictAddressFamilies= (allow list): socket() with any other family fails with EAFNOSUPPORT
    families = set(policy["address_families"])
    load(ALLOW, [(ERRNO(policy["eafnosupport"]), "socket", [(0, EQ, af, 0)]) for af in range(64) if af not in families]
                + [(ERRNO(policy["eafnosupport"]), "socket", [(0, GE, 64, 0)])])
    if policy["memory_deny_write_execute"]:
        W, X, SHM_EXEC = 0x2, 0x4, 0o100000
        eperm = ERRNO(policy["eperm"])
        load(ALLOW, [
            (eperm, "mmap", [(2, MASKED_EQ, W | X, W | X)]),
            (eperm, "mprotect", [(2, MASKED_EQ, X, X)]),
            (eperm, "pkey_mprotect", [(2, MASKED_EQ, X, X)]),
            (eperm, "shmat", [(2, MASKED_EQ, SHM_EXEC, SHM_EXEC)]),
        ])
    # SystemCallFilter= (allow list) with SystemCallErrorNumber=; last, since seccomp() itself
    # is not on the list (the kernel runs every filter and the strictest answer wins)
    load(ERRNO(policy["errno"]), [(ALLOW, name, []) for name in policy["allowed_syscalls"]])
    os.execv(argv[0], argv)
    """
)

# What the daemon does, in one process; prints a JSON report.
WORKLOAD = textwrap.dedent(
    r"""
    import asyncio, errno, json, mmap, os, socket, ssl, sys
    from pathlib import Path

    home, notify_path = Path(sys.argv[1]), sys.argv[2]
    report = {}

    import numpy as np
    a = np.random.default_rng(0).random((400, 400))
    b = a @ a.T  # BLAS, on its own threads
    report["numpy"] = bool(np.linalg.eigvalsh(b[:100, :100]).min() > -1e-9)

    import pydantic
    class Model(pydantic.BaseModel):
        x: int
    report["pydantic"] = Model.model_validate({"x": "3"}).x == 3

    # the compiled parts of the libraries the daemon loads
    import yaml, telegram, telegram.ext, discord, slack_sdk, slack_bolt, apscheduler, rich, click
    import prometheus_client, jiter, multidict, yarl, frozenlist, propcache, aiohttp
    report["imports"] = True
    report["ssl"] = ssl.create_default_context().verify_mode == ssl.CERT_REQUIRED

    from state import SessionDB, new_session_id
    with SessionDB(home / "state.db") as db:
        sid = db.sessions.create(new_session_id(), "telegram")
        db.messages.append(sid, "user", "hello from the sandbox")
        report["sqlite"] = [m.content for m in db.messages.get(sid)] == ["hello from the sandbox"]
        report["fts5"] = len(db.search.messages("sandbox")) == 1

    async def network():
        from openai import AsyncOpenAI
        from tests.fakes.model_server import FakeModel
        loop = asyncio.get_running_loop()
        # getaddrinfo with AI_ADDRCONFIG, as aiohttp's resolver calls it: glibc asks netlink,
        # which RestrictAddressFamilies= refuses, and must fall back
        infos = await loop.getaddrinfo("localhost", 443, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
        report["resolve"] = bool(infos)
        async with FakeModel() as model:
            client = AsyncOpenAI(base_url=model.base_url, api_key="sandbox", max_retries=0)
            reply = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "ping"}])
            report["model"] = reply.choices[0].message.content.startswith("echo: ping")
            await client.close()
        report["threads"] = await loop.run_in_executor(None, sum, [1, 2]) == 3

    asyncio.run(network())

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.sendto(b"READY=1", notify_path)
    sock.close()

    def refused(fn):
        try:
            fn()
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))
        return "allowed"

    report["wx_mapping"] = refused(lambda: mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC))
    report["netlink_socket"] = refused(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
    report["sched_setaffinity"] = refused(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
    print(json.dumps(report), flush=True)
    """
)


def _syscall_groups(analyze: str) -> dict[str, list[str]]:
    """Every ``@group`` and its entries (names or nested groups), from systemd itself."""
    out = subprocess.run([analyze, "syscall-filter"], capture_output=True, text=True, timeout=60, check=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif current is not None and line.startswith("    ") and not line.strip().startswith("#"):
            current.append(line.strip())
        elif not line.strip():
            current = None
    return groups


def _expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    result: set[str] = set()
    for name in names:
        result |= _expand(groups[name], groups) if name.startswith("@") else {name}
    return result


def _unit_values(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


def policy_from_unit(unit_text: str, analyze: str, libseccomp: str) -> dict:
    """The unit's seccomp settings as the launcher needs them, with systemd's semantics."""
    groups = _syscall_groups(analyze)
    allowed: set[str] | None = None
    for value in _unit_values(unit_text, "SystemCallFilter"):
        deny = value.startswith("~")
        names = _expand(value.lstrip("~").split(), groups)
        if allowed is None:
            assert not deny, "the unit's first SystemCallFilter= is an allow list"
            allowed = names
        elif deny:
            allowed -= names
        else:
            allowed |= names
    assert allowed, "the unit has no SystemCallFilter="
    (errno_name,) = _unit_values(unit_text, "SystemCallErrorNumber")
    (families,) = _unit_values(unit_text, "RestrictAddressFamilies")
    return {
        "libseccomp": libseccomp,
        "allowed_syscalls": sorted(allowed),
        "errno": getattr(errno, errno_name),
        "eperm": errno.EPERM,
        "eafnosupport": errno.EAFNOSUPPORT,
        "address_families": [int(getattr(socket, name)) for name in families.split()],
        "memory_deny_write_execute": _unit_values(unit_text, "MemoryDenyWriteExecute") == ["yes"],
    }


@pytest.fixture
def policy(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (it expands the syscall groups): apt-get install systemd")
    libseccomp = find_library("seccomp")
    if libseccomp is None:
        pytest.skip("libseccomp is not installed (it builds the filters): apt-get install libseccomp2")
    config = tmp_path / "config.yaml"
    config.write_text("agent: main\n")
    plan = plan_install("system", config=config, home=tmp_path / "home", unit_dir=tmp_path, run_as="daemon")
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy_from_unit(plan.unit_text, analyze, libseccomp)))
    return path


def test_policy_is_read_from_the_unit_with_systemds_groups(policy):
    data = json.loads(policy.read_text())
    allowed = set(data["allowed_syscalls"])
    assert {"read", "write", "mmap", "futex", "epoll_wait", "socket", "connect", "clone3", "execve"} <= allowed
    assert not {"setuid", "reboot", "mount", "sched_setaffinity", "setrlimit", "bpf"} & allowed  # ~@privileged @resources
    assert data["address_families"] == [socket.AF_UNIX, socket.AF_INET, socket.AF_INET6]
    assert data["memory_deny_write_execute"] is True
    assert data["errno"] == errno.EPERM


def test_daemon_workload_runs_under_the_units_seccomp_restrictions(policy, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = str(tmp_path / "notify.sock")
    notify.bind(notify_path)
    notify.settimeout(60)
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(policy), "--", sys.executable, "-c", WORKLOAD, str(home), notify_path],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {
        "numpy": True, "pydantic": True, "imports": True, "ssl": True, "sqlite": True, "fts5": True,
        "resolve": True, "model": True, "threads": True,
        # and each restriction was really in force
        "wx_mapping": "EPERM",  # MemoryDenyWriteExecute=
        "netlink_socket": "EAFNOSUPPORT",  # RestrictAddressFamilies=
        "sched_setaffinity": "EPERM",  # SystemCallFilter=~@resources, SystemCallErrorNumber=EPERM
    }
    assert notify.recv(4096) == b"READY=1"
    notify.close()


def test_without_the_filters_the_forbidden_calls_succeed(tmp_path):
    """The control: the same probes outside the sandbox are allowed, so the refusals above come from the filters."""
    probe = textwrap.dedent(
        """
        import mmap, os, socket
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC).close()
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
        os.sched_setaffinity(0, os.sched_getaffinity(0))
        print("allowed")
        """
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "allowed\n", proc.stderr


# Runs in the child before LAUNCHER, in a new mount namespace (unshare --mount):
# the unit's file-system settings, as systemd sets them up.  Only the standard library.
NAMESPACE = textwrap.dedent(
    r"""
    import os, subprocess, sys

    home = sys.argv[1]
    argv = sys.argv[sys.argv.index("--") + 1:]

    def mount(*args):
        subprocess.run(["mount", *args], check=True)

    mount("--make-rprivate", "/")
    stage = "/mnt"  # a private place to keep what the steps below cover up
    mount("-t", "tmpfs", "-o", "mode=0700", "stage", stage)
    os.mkdir(f"{stage}/home")
    mount("--bind", home, f"{stage}/home")
    os.mkdir(f"{stage}/dev")
    mount("--rbind", "/dev", f"{stage}/dev")
    # A checkout or virtual environment under /tmp (a CI clone) would vanish under PrivateTmp; the
    # real unit never runs from /tmp (service install warns), so keep those trees visible here.
    keep = sorted({"/".join(p.split("/")[:3]) for p in (os.getcwd(), os.path.realpath(argv[0]))
                   if p.startswith("/tmp/")})
    for i, path in enumerate(keep):
        os.mkdir(f"{stage}/keep{i}")
        mount("--rbind", path, f"{stage}/keep{i}")
    # PrivateTmp=yes
    for tmp in ("/tmp", "/var/tmp"):
        mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", tmp)
    for i, path in enumerate(keep):
        os.makedirs(path, exist_ok=True)
        mount("--rbind", f"{stage}/keep{i}", path)
    # PrivateDevices=yes: only the pseudo devices
    mount("-t", "tmpfs", "-o", "mode=0755", "dev", "/dev")
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        open(f"/dev/{name}", "w").close()
        mount("--bind", f"{stage}/dev/{name}", f"/dev/{name}")
    os.mkdir("/dev/shm")
    mount("-t", "tmpfs", "-o", "mode=1777", "shm", "/dev/shm")
    # ReadWritePaths=<home>: back at its path (PrivateTmp hid it when it is under /tmp), writable
    os.makedirs(home, exist_ok=True)
    mount("--bind", f"{stage}/home", home)
    # ProtectProc=invisible, ProcSubset=pid
    mount("-t", "proc", "-o", "hidepid=invisible,subset=pid", "proc", "/proc")
    subprocess.run(["umount", "--recursive", "--lazy", stage], check=True)
    # ProtectSystem=strict, ProtectHome=read-only, ProtectKernelTunables=yes: all else read-only
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    for point in points:
        if point not in (home, "/tmp", "/var/tmp", "/dev/shm", "/proc") and os.path.exists(point):
            subprocess.run(["mount", "-o", "remount,bind,ro", point], capture_output=True)
    os.execv(argv[0], argv)
    """
)

# Tries what the file-system settings forbid; prints a JSON report.
FS_PROBE = textwrap.dedent(
    r"""
    import json, os, sys

    home = sys.argv[1]
    def write(path):
        try:
            with open(path, "w") as fh:
                fh.write("x")
        except OSError as exc:
            return exc.strerror
        os.unlink(path)
        return "ok"

    print(json.dumps({
        "etc": write("/etc/switchboard-probe"),
        "usr": write("/usr/switchboard-probe"),
        "root": write("/root/switchboard-probe"),
        "source_tree": write(os.path.join(os.getcwd(), "switchboard-probe")),
        "home": write(os.path.join(home, "probe")),
        "tmp": write("/tmp/probe"),
        "tmp_is_private": sorted(os.listdir("/tmp")) == sorted({p.split("/")[2] for p in (home, os.getcwd(), sys.prefix)
                                                               if p.startswith("/tmp/")}),
        "dev": sorted(os.listdir("/dev")),
        "proc_cpuinfo": os.path.exists("/proc/cpuinfo"),
        "proc_self": os.path.exists("/proc/self/status"),
    }))
    """
)


def _mount_namespace_prefix() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("emulating the unit's mount settings needs root (mount namespaces); run the suite as root")
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("unshare/mount are not installed: apt-get install util-linux mount")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"this machine refuses new mount namespaces ({probe.stderr.strip()})")
    return ["unshare", "--mount", "--propagation", "private"]


def test_file_system_settings_emulation_really_confines(tmp_path):
    """The control for the test below: inside the emulated namespace only the home and /tmp are writable."""
    prefix = _mount_namespace_prefix()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", NAMESPACE, str(home), "--", sys.executable, "-c", FS_PROBE, str(home)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == {
        "etc": "Read-only file system",
        "usr": "Read-only file system",
        "root": "Read-only file system",
        "source_tree": "Read-only file system",
        "home": "ok",
        "tmp": "ok",
        "tmp_is_private": True,  # only the way back to the home, nothing of the host's /tmp
        "dev": ["full", "null", "random", "shm", "tty", "urandom", "zero"],
        "proc_cpuinfo": False,
        "proc_self": True,
    }


def _run_daemon_until_stopped(argv_prefix: list[str], home: Path) -> None:
    """Start `switchboard run` under ``argv_prefix``; expect READY=1, WATCHDOG=1, then STOPPING=1 and exit 0 on SIGTERM."""
    import signal
    import time

    config = home / "daemon.yaml"
    config.write_text(f"home: {home}\napi:\n  port: 0\n")  # every platform off: no token set
    notify_path = home / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WATCHDOG_", "TELEGRAM_", "DISCORD_", "SLACK_"))}
    env |= {"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "1000000", "SWITCHBOARD_HOME": str(home)}
    switchboard = Path(sys.executable).parent / "switchboard"
    proc = subprocess.Popen(
        [*argv_prefix, str(switchboard), "run", "--config", str(config)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    received: list[str] = []

    def wait_for(prefix: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(m.startswith(prefix) for m in received):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or proc.poll() is not None:
                proc.kill()
                raise AssertionError(f"no {prefix} (got {received}); daemon stderr:\n{proc.communicate()[1][-3000:]}")
            notify.settimeout(min(remaining, 1.0))
            try:
                received.append(notify.recv(4096).decode())
            except socket.timeout:
                pass

    try:
        wait_for("READY=1")
        wait_for("WATCHDOG=1")  # pinged by the event loop
        proc.send_signal(signal.SIGTERM)
        wait_for("STOPPING=1")
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert (home / "state.db").exists()  # it wrote its store in the home


def test_the_daemon_itself_runs_under_the_units_seccomp_restrictions(policy, tmp_path):
    """`switchboard run` as the unit starts it, with a fake NOTIFY_SOCKET."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    _run_daemon_until_stopped([sys.executable, "-c", LAUNCHER, str(policy), "--"], home)


def test_the_daemon_runs_under_the_units_file_system_and_seccomp_restrictions(policy, tmp_path):
    """All of it at once: mounts as the unit sets them, then the seccomp filters, then `switchboard run`."""
    prefix = _mount_namespace_prefix()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    inside = home / "policy.json"  # PrivateTmp hides everything else under /tmp
    shutil.copy(policy, inside)
    _run_daemon_until_stopped(
        [*prefix, sys.executable, "-c", NAMESPACE, str(home), "--", sys.executable, "-c", LAUNCHER, str(inside), "--"],
        home,
    )
