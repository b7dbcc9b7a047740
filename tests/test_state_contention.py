"""Several processes writing at once, while another holds the write lock: nothing lost, no error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from state import SessionDB

ROOT = Path(__file__).resolve().parent.parent

WRITER = """
import sys
from state import SessionDB
path, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
db = SessionDB(path)
for i in range(count):
    db.append_message(f"s{worker}", "user", f"worker {worker} message {i}", platform_message_id=f"{worker}-{i}")
db.close()
print("done")
"""

# holds SQLite's write lock with a plain connection (not our writer queue) for 2 s
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(2.0)
conn.execute("COMMIT")
print("released", flush=True)
"""


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_four_writers_and_a_lock_holder_lose_nothing(home):
    path = home / "state.db"
    with SessionDB(path) as db:
        for worker in range(4):
            db.create_session(f"s{worker}", "cli")
    holder = _spawn(HOLDER, str(path))
    assert holder.stdout.readline().strip() == "locked"
    writers = [_spawn(WRITER, str(path), str(worker), "250") for worker in range(4)]
    outcomes = [w.communicate(timeout=60) + (w.returncode,) for w in writers]
    holder_out, holder_err = holder.communicate(timeout=30)
    assert holder_out.strip() == "released" and holder_err == ""
    assert outcomes == [("done\n", "", 0)] * 4
    with SessionDB(path) as db:
        assert db.message_count() == 1000
        for worker in range(4):
            contents = [m["content"] for m in db.get_messages(f"s{worker}")]
            assert contents == [f"worker {worker} message {i}" for i in range(250)]
            assert db.get_session(f"s{worker}")["message_count"] == 250
