"""One daemon per home: the flock on <home>/switchboard.lock."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gateway.errors import AlreadyRunning
from gateway.runtime import lockfile
from gateway.runtime.systemd import daemon_running

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gateway.runtime import lockfile
    handle = lockfile.acquire(Path(sys.argv[1]))
    print("locked", flush=True)
    sys.stdin.read()  # hold until the test closes stdin (or kills us)
    """
)


def _hold_in_subprocess(home):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline() == "locked\n", proc.stderr.read()
    return proc


def test_second_acquire_in_the_same_home_is_refused_with_the_holders_pid(tmp_path):
    with lockfile.acquire(tmp_path) as first:
        assert first.held
        with pytest.raises(AlreadyRunning) as info:
            lockfile.acquire(tmp_path)
        assert f"(pid {os.getpid()})" in str(info.value)
        assert "stop it first" in str(info.value)
    assert not first.held
    lockfile.acquire(tmp_path).release()  # free again once released


def test_lock_file_is_private(tmp_path):
    with lockfile.acquire(tmp_path):
        assert oct(os.stat(tmp_path / "switchboard.lock").st_mode & 0o777) == "0o600"


def test_is_locked_sees_another_process_and_the_lock_dies_with_it(tmp_path):
    assert not lockfile.is_locked(tmp_path)  # no file yet
    proc = _hold_in_subprocess(tmp_path)
    try:
        assert lockfile.is_locked(tmp_path)
        assert daemon_running(tmp_path)
        assert lockfile.holder_pid(tmp_path) == proc.pid
        with pytest.raises(AlreadyRunning):
            lockfile.acquire(tmp_path)
    finally:
        proc.kill()  # no clean-up code runs: the kernel drops the lock
        proc.wait(timeout=10)
    assert not lockfile.is_locked(tmp_path)
    assert (tmp_path / "switchboard.lock").exists()  # a stale file is harmless
    lockfile.acquire(tmp_path).release()


def test_is_locked_does_not_take_the_lock(tmp_path):
    with lockfile.acquire(tmp_path):
        assert lockfile.is_locked(tmp_path)
    assert not lockfile.is_locked(tmp_path)
    with lockfile.acquire(tmp_path):  # looking left nothing behind
        pass
