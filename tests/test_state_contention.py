"""Several processes writing at once, while another holds the write lock: nothing lost, no error."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from state import SessionDB, WriteTimeout

ROOT = Path(__file__).resolve().parent.parent

WRITER = """
import sys
from state import SessionDB
path, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
db = SessionDB(path)
for i in range(count):
    db.messages.append(f"s{worker}", "user", f"worker {worker} message {i}", platform_message_id=f"{worker}-{i}")
db.close()
print("done")
"""

# holds SQLite's write lock with a plain connection (which knows nothing of our flag) for 2 s
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
            db.sessions.create(f"s{worker}", "cli")
    holder = _spawn(HOLDER, str(path))
    assert holder.stdout.readline().strip() == "locked"
    writers = [_spawn(WRITER, str(path), str(worker), "250") for worker in range(4)]
    outcomes = [w.communicate(timeout=60) + (w.returncode,) for w in writers]
    holder_out, holder_err = holder.communicate(timeout=30)
    assert holder_out.strip() == "released" and holder_err == ""
    assert outcomes == [("done\n", "", 0)] * 4
    with SessionDB(path) as db:
        assert db.messages.count() == 1000
        for worker in range(4):
            contents = [m.content for m in db.messages.get(f"s{worker}")]
            assert contents == [f"worker {worker} message {i}" for i in range(250)]
            assert db.sessions.get(f"s{worker}").message_count == 250


# a Switchboard writer that stays inside its write transaction until told to finish
SLOW_WRITER = """
import sys
from state import SessionDB
db = SessionDB(sys.argv[1])
def slow(conn):
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('slow', 'cli', 0)")
    print("inside", flush=True)
    sys.stdin.readline()
db._engine.write(slow)
db.close()
print("done", flush=True)
"""


def test_a_write_waiting_for_another_process_times_out_and_a_patient_one_goes_in_after_it(home):
    path = home / "state.db"
    SessionDB(path).close()
    slow = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(path)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert slow.stdout.readline().strip() == "inside"
        with SessionDB(path, write_timeout=0.2) as db:
            with pytest.raises(WriteTimeout):
                db.sessions.create("impatient", "cli")  # waits for the slow writer, gives up
            assert db.sessions.get("impatient") is None
            db.write_timeout = 30.0
            results = []
            patient = threading.Thread(target=lambda: results.append(db.sessions.create("patient", "cli")))
            patient.start()
            slow.stdin.write("go\n")
            slow.stdin.flush()
            patient.join(timeout=30)
            assert results == ["patient"]
            assert db.sessions.get("slow") is not None and db.sessions.get("impatient") is None
        assert slow.communicate(timeout=30)[0].strip() == "done"
    finally:
        slow.kill()


OPENER = """
import sys
from state import SessionDB
with SessionDB(sys.argv[1]) as db:
    db.sessions.create(sys.argv[2], "cli")
    db.messages.append(sys.argv[2], "user", "first words")
print("ok")
"""


def test_processes_opening_a_new_database_at_once_all_succeed(home):
    path = home / "state.db"
    procs = [_spawn(OPENER, str(path), f"s{i}") for i in range(4)]
    assert [p.communicate(timeout=60) + (p.returncode,) for p in procs] == [("ok\n", "", 0)] * 4
    with SessionDB(path) as db:
        assert sorted(r["id"] for r in db.sessions.list_rich()) == ["s0", "s1", "s2", "s3"]
        assert db.messages.count() == 4


# appends as fast as it can until the file named by argv[2] exists, then prints how many it stored
GREEDY = """
import os, sys
from state import SessionDB
db = SessionDB(sys.argv[1])
print("writing", flush=True)
n = 0
while not os.path.exists(sys.argv[2]):
    db.messages.append("greedy", "user", f"greedy {n}")
    n += 1
db.close()
print(n, flush=True)
"""


def test_a_writer_that_never_pauses_does_not_keep_another_process_out(home):
    """The greedy writer tries again the moment it has committed; ours, once it has waited a little, raises
    its flag, which holds the greedy one back until ours is in: its writes are interleaved."""
    path = home / "state.db"
    with SessionDB(path) as db:
        db.sessions.create("greedy", "cli")
        db.sessions.create("polite", "cli")
    stop = home / "stop"
    greedy = _spawn(GREEDY, str(path), str(stop))
    try:
        assert greedy.stdout.readline().strip() == "writing"
        with SessionDB(path) as db:
            for i in range(30):
                db.messages.append("polite", "user", f"polite {i}")
            assert greedy.poll() is None  # all 30 stored while the greedy writer was still writing
            last_polite = db.messages.get("polite")[-1].id
            # and it goes on writing after our last one (however slowly a loaded machine schedules it)
            deadline = time.monotonic() + 30
            while not any(m.id > last_polite for m in db.messages.get("greedy")):
                assert time.monotonic() < deadline, "the greedy writer stopped writing"
                time.sleep(0.01)
            stop.touch()
            stored = int(greedy.communicate(timeout=30)[0].strip())
            polite_ids = [m.id for m in db.messages.get("polite")]
            greedy_ids = [m.id for m in db.messages.get("greedy")]
        assert len(polite_ids) == 30 and len(greedy_ids) == stored
    finally:
        greedy.kill()


# raises the flag of a starving writer and stays stopped with it up, as a writer stopped by Ctrl-Z
# while it waits would
STOPPED_STARVING = """
import sys
from pathlib import Path
from state._lock import StarvingFlag
flag = StarvingFlag(Path(sys.argv[1]))
flag.raise_()
print("raised", flush=True)
sys.stdin.readline()
"""


def test_a_process_stopped_with_its_flag_up_does_not_keep_writers_out(home):
    path = home / "state.db"
    with SessionDB(path) as db:
        db.sessions.create("s", "cli")
    stopped = subprocess.Popen([sys.executable, "-c", STOPPED_STARVING, str(path)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert stopped.stdout.readline().strip() == "raised"
        with SessionDB(path, write_timeout=5.0) as db:
            for i in range(20):  # each would time out if a raised flag held writers back for good
                db.messages.append("s", "user", f"message {i}")
            assert [m.content for m in db.messages.get("s")] == [f"message {i}" for i in range(20)]
        assert stopped.poll() is None
    finally:
        stopped.kill()


def test_a_raised_flag_is_seen_by_every_other_writer_and_goes_with_its_writer(home):
    from state._lock import StarvingFlag

    path = home / "state.db"
    SessionDB(path).close()
    starving, other, third = (StarvingFlag(path) for _ in range(3))  # an open file each, like three processes
    try:
        assert not other.up_elsewhere()
        starving.raise_()
        third.raise_()  # two writers may starve at once
        assert (starving.up_elsewhere(), other.up_elsewhere()) == (True, True)
        third.lower()
        assert (starving.up_elsewhere(), other.up_elsewhere(), third.up_elsewhere()) == (False, True, True)
        starving.close()  # a writer that ends (or dies) takes its flag with it
        assert not other.up_elsewhere()
    finally:
        other.close()
        third.close()
