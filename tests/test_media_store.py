"""The media store: files outside the database, referred to by hash, gone with their sessions.

Every test using ``store``/``store_target`` runs on SQLite and PostgreSQL (tests/conftest.py).
"""

from __future__ import annotations

import base64
import os
import sqlite3
import stat
import time

import pytest

import state
from gateway.media import MediaService
from gateway.media_read import read_file
from gateway.runtime.deadletters import dead_letter_row, message_from_json
from gateway.types import Attachment, ChatType, InboundMessage
from state import AsyncSessionDB, SessionDB
from state.media_files import BadHash, MediaFiles, sha256_of
from tests.fakes import files as samples

DAY = 86_400.0


def _old(files: MediaFiles, seconds: float = 2 * DAY) -> None:
    """Every file as if written ``seconds`` ago (the files of an old session)."""
    then = time.time() - seconds
    for sha in files.hashes():
        os.utime(files.path(sha), (then, then))


def test_a_file_is_kept_once_by_its_hash_private_to_the_gateways_user(tmp_path):
    files = MediaFiles(tmp_path / "media")
    picture = samples.png()
    sha = files.put(picture)
    assert sha == sha256_of(picture) and files.put(picture) == sha
    assert list(files.hashes()) == [sha] and files.read(sha) == picture
    path = files.path(sha)
    assert path == tmp_path / "media" / sha[:2] / sha[2:]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in (path.parent, tmp_path / "media")} == {0o700}
    assert files.usage() == (1, len(picture))
    with pytest.raises(BadHash):
        files.path("../../etc/passwd")


def test_a_sweep_keeps_referenced_and_fresh_files_and_deletes_the_rest(tmp_path):
    files = MediaFiles(tmp_path / "media")
    kept, stray, doomed = files.put(b"kept"), files.put(b"stray"), files.put(b"doomed")
    fresh = files.put(b"saved just now, its message not stored yet")
    for sha in (kept, stray):
        then = time.time() - 2 * 3600
        os.utime(files.path(sha), (then, then))
    swept = files.sweep({kept}, doomed={doomed})
    assert sorted(files.hashes()) == sorted([kept, fresh])
    assert (swept.files, swept.bytes) == (2, len(b"stray") + len(b"doomed"))


def test_references_go_with_their_session_on_both_engines(store):
    store.sessions.create("s1", "telegram")
    store.sessions.create("s2", "telegram")
    first = store.messages.append_inbound("s1", "look\n[attached image: a.png]", platform_message_id="1")
    other = store.messages.append_inbound("s2", "[attached image: a.png]", platform_message_id="1")
    ref = {"sha256": "a" * 64, "name": "a.png", "mime": "image/png", "size": 10, "kind": "image"}
    assert store.media.attach(first.id, [ref, {**ref, "sha256": "b" * 64, "name": "b.pdf", "kind": "document",
                                               "text": "zeppelin fleet report"}]) == 2
    assert store.media.attach(first.id, [ref]) == 0  # once only
    store.media.attach(other.id, [ref])
    assert [m["name"] for m in store.media.of_lineage("s1")] == ["a.png", "b.pdf"]
    assert [h["name"] for h in store.media.search("ZEPPELIN report")] == ["b.pdf"]
    assert store.media.of_sessions(["s1"]) == {"a" * 64, "b" * 64}
    assert store.media.stats() == {"references": 3, "files": 2, "bytes": 20}
    store.sessions.delete("s1")
    assert store.media.referenced() == {"a" * 64}  # still the other session's
    assert store.media.of_lineage("s1") == []


def test_a_file_marked_refused_keeps_its_note_on_every_reference_on_both_engines(store):
    store.sessions.create("s1", "telegram")
    first = store.messages.append_inbound("s1", "[attached image: a.png]", platform_message_id="1")
    again = store.messages.append_inbound("s1", "[attached image: a.png]", platform_message_id="2")
    ref = {"sha256": "a" * 64, "name": "a.png", "mime": "image/png", "size": 10, "kind": "image"}
    store.media.attach(first.id, [ref])
    store.media.attach(again.id, [ref])
    assert store.media.set_note("a" * 64, "was refused by the model (HTTP 400)") == 2
    assert store.media.set_note("a" * 64, "a second reason") == 0  # the first reason stays
    assert [m["note"] for m in store.media.of_lineage("s1")] == ["was refused by the model (HTTP 400)"] * 2


def test_a_compressed_session_finds_the_media_of_the_messages_it_carries_over(store):
    store.sessions.create("parent", "telegram")
    sent = store.messages.append_inbound("parent", "[attached image: cat.png]", platform_message_id="1")
    store.media.attach(sent.id, [{"sha256": "c" * 64, "name": "cat.png", "mime": "image/png", "size": 3,
                                  "kind": "image"}])
    store.sessions.create("child", "telegram", parent_session_id="parent")
    assert [(m["session_id"], m["name"]) for m in store.media.of_lineage("child")] == [("parent", "cat.png")]


def test_a_lineage_gives_each_session_once_oldest_first_and_nine_sessions_at_most(store):
    def chain(names: list[str]) -> None:  # the first the oldest; each message with an image named after it
        for i, name in enumerate(names):
            store.sessions.create(name, "telegram", parent_session_id=names[i - 1] if i else None)
            sent = store.messages.append_inbound(name, f"[attached image: {name}.png]", platform_message_id=name)
            store.media.attach(sent.id, [{"sha256": name[-1] * 64, "name": f"{name}.png", "mime": "image/png",
                                          "size": 1, "kind": "image"}])

    chain(["a", "b", "c"])
    store._engine.write(lambda conn: conn.execute("UPDATE sessions SET parent_session_id = 'c' WHERE id = 'a'"))
    assert [m["session_id"] for m in store.media.of_lineage("c")] == ["a", "b", "c"]  # the loop of parents ends
    assert [m["session_id"] for m in store.media.of_lineage("a")] == ["b", "c", "a"]
    names = [f"g{i}" for i in range(12)]
    chain(names)
    assert [m["session_id"] for m in store.media.of_lineage("g11")] == names[3:]
    assert [m["session_id"] for m in store.media.of_lineage("no such session")] == []


async def test_an_image_the_session_carries_over_goes_to_the_model_again(tmp_path):
    async with await AsyncSessionDB.open(tmp_path / "state.db") as db:
        media = MediaService(db, MediaFiles(tmp_path / "media"), images_in_context=1)
        await db.sessions.create("s", "telegram")
        first = await db.messages.append_inbound("s", "[attached image: a.png]", platform_message_id="1")
        second = await db.messages.append_inbound("s", "[attached image: a.png]", platform_message_id="2")
        await media.keep(first.id, [Attachment("image", "a.png", "image/png", data=samples.png(rgb=(1, 1, 1)))])
        await media.keep(second.id, [Attachment("image", "a.png", "image/png", data=samples.png(rgb=(2, 2, 2)))])
        history = [{"role": "user", "content": "[attached image: a.png]"},
                   {"role": "assistant", "content": "a dark picture"},
                   {"role": "user", "content": "[attached image: a.png]"}]
        sent = await media.expand("s", history, vision=True)
    assert sent[0] == history[0] and sent[1] == history[1]  # the older picture is past images_in_context
    assert [p["type"] for p in sent[2]["content"]] == ["text", "image_url"]
    assert sent[2]["content"][1]["image_url"]["url"].endswith(
        base64.b64encode(samples.png(rgb=(2, 2, 2))).decode())


@pytest.mark.slow  # 1,000 media messages (about 15 s): make test runs it, make test-fast leaves it out
@pytest.mark.sqlite_only("the size of state.db on disk is SQLite's")
def test_state_db_holds_no_blob_larger_than_4kb_after_1000_media_messages(tmp_path):
    """Like the daemon: each message's file kept in the media folder, the message referring to it."""
    files = MediaFiles(tmp_path / "media")
    with SessionDB(tmp_path / "state.db") as db:
        db.sessions.create("s", "telegram")
        for i in range(1000):
            picture = samples.png(16, 16, rgb=(i % 256, i // 256, 7))
            sent = db.messages.append_inbound("s", "[attached image: photo.jpg]", platform_message_id=str(i))
            db.media.attach(sent.id, [{"sha256": files.put(picture), "name": "photo.jpg", "mime": "image/png",
                                       "size": len(picture), "kind": "image"}])
    with sqlite3.connect(tmp_path / "state.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        biggest = 0
        for table in tables:
            cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
            for col in cols:
                row = conn.execute(f'SELECT MAX(LENGTH(CAST("{col}" AS BLOB))) FROM "{table}"').fetchone()
                biggest = max(biggest, row[0] or 0)
    assert biggest <= 4096
    assert files.usage()[0] == 1000


async def test_retention_deletes_the_references_and_the_upkeep_sweep_the_files(tmp_path):
    now = time.time()
    files = MediaFiles(tmp_path / "media")
    async with await AsyncSessionDB.open(tmp_path / "state.db") as db:
        media = MediaService(db, files)
        for sid in ("old", "recent"):
            await db.sessions.create(sid, "telegram")
            sent = await db.messages.append_inbound(sid, "[attached document: notes.txt]", platform_message_id="1",
                                           timestamp=now - (10 * DAY if sid == "old" else 0))
            await media.keep(sent.id, [Attachment("document", "notes.txt", "text/plain", data=f"{sid} notes".encode())])
            await db.sessions.end(sid, "reset")
        with SessionDB(tmp_path / "state.db") as sync:
            sync._engine.write(lambda conn: conn.execute(
                "UPDATE sessions SET started_at = $1, ended_at = $2, last_active = $3 WHERE id = 'old'",
                (now - 10 * DAY, now - 10 * DAY, now - 10 * DAY)))
        _old(files)
        report = await state.run_upkeep(db, retention_days=1, now=now)
        swept = await media.sweep()
        referenced = await db.media.referenced()
    assert report.sessions_pruned == 1 and swept.files == 1
    assert list(files.hashes()) == sorted(referenced) == [sha256_of(b"recent notes")]


def test_a_dead_letter_refers_to_its_files_by_hash_and_keeps_them_while_it_is_kept(tmp_path):
    files = MediaFiles(tmp_path / "media")
    picture = samples.png()
    msg = InboundMessage("telegram", ChatType.DM, "1", "1", "look", message_id="9",
                         attachments=(Attachment("image", "cat.png", "image/png", len(picture), data=picture),))
    row = dead_letter_row("telegram", "9", {"update_id": 9}, msg, "boom", files=files)
    [stored] = __import__("json").loads(row["message"])["attachments"]
    assert stored["sha256"] == sha256_of(picture) and "data" not in stored
    assert base64.b64encode(picture).decode() not in row["message"]
    assert message_from_json(row["message"], files).attachments == msg.attachments
    with SessionDB(tmp_path / "state.db") as db:
        dl = db.dead_letters.add(**row)
        _old(files)
        assert files.sweep(db.media.referenced()).files == 0  # the dead letter still refers to it
        db.dead_letters.set_status(dl, "dropped")  # dropped is kept (and may be retried): so is its file
        assert files.sweep(db.media.referenced()).files == 0
        db._engine.write(lambda conn: conn.execute("DELETE FROM dead_letters WHERE id = $1", (dl,)))
        assert files.sweep(db.media.referenced()).files == 1


@pytest.mark.parametrize("kind, name, mime, data, note", [
    ("document", "report.pdf", "application/pdf", samples.zip_bomb(), "says it is a PDF but is a ZIP archive; "
                                                                      "it was not opened"),
    ("document", "notes.txt", "text/plain", samples.zip_bomb(), "says it is text but is a ZIP archive; it was not opened"),
    ("document", "broken.pdf", "application/pdf", samples.broken_pdf(), "is a PDF that does not parse; it was not read"),
    ("document", "fake.pdf", "application/pdf", b"just words", "says it is a PDF but is not one; it was not read"),
    ("document", "data.csv", "text/csv", b"\x00\x01\x02binary", "says it is text but holds binary data; it was not read"),
    ("image", "cat.jpg", "image/jpeg", b"GIF? no, text", "is not a picture (its bytes are not JPEG, PNG, GIF or WebP), "
                                                         "so the model cannot see it"),
    ("audio", "voice.ogg", "audio/ogg", b"\x00\x11 unknown codec", "is audio in a format I do not recognise, so it "
                                                                    "cannot be transcribed"),
    ("document", "empty.md", "text/markdown", b"", "is empty"),
])
def test_bad_input_is_described_with_one_line_never_an_exception(kind, name, mime, data, note):
    reading = read_file(kind, name, mime, data, max_chars=1000)
    assert (reading.text, reading.note) == (None, note)


def test_documents_become_text_up_to_max_document_chars():
    assert read_file("document", "q.pdf", "application/pdf", samples.pdf("Revenue 42"), max_chars=100).text == "Revenue 42"
    assert read_file("document", "a.md", None, "# Título\n".encode(), max_chars=100).text == "# Título\n"
    assert read_file("document", "a.json", "application/json", b'{"a": [1, 2]}', max_chars=100).text == '{"a": [1, 2]}'
    cut = read_file("document", "big.txt", "text/plain", b"x" * 500, max_chars=100).text
    assert cut == "x" * 100 + "\n[... cut here: 400 more characters not read ...]"
    other = read_file("document", "slides.pptx", "application/vnd.ms-powerpoint", b"\xd0\xcf\x11\xe0", max_chars=100)
    assert (other.text, other.note) == (None, None)  # described by name, type and size


async def test_a_file_over_its_kinds_limit_is_not_kept_and_the_user_is_told(tmp_path):
    from gateway.types import MediaLimits

    async with await AsyncSessionDB.open(tmp_path / "state.db") as db:
        media = MediaService(db, MediaFiles(tmp_path / "media"), limits=MediaLimits(image=10, audio=10, document=10))
        kept = await media.keep(None, [Attachment("document", "big.txt", "text/plain", data=b"x" * 11)])
    assert kept.items == () and kept.notes == ("big.txt is 11 bytes, more than the 10 kept for a document; "
                                               "only its name reaches the model.",)
    assert not (tmp_path / "media").exists()


def test_storage_reports_the_media_folder_and_backup_says_where_it_is_or_copies_it(tmp_path):
    from click.testing import CliRunner

    from gateway.cli.service import backup_cmd
    from gateway.cli.storage import storage_cmd

    home = tmp_path / "home"
    files = MediaFiles(home / "media")
    with SessionDB(home / "state.db") as db:
        db.sessions.create("s", "telegram")
        sent = db.messages.append_inbound("s", "[attached image: a.png]", platform_message_id="1")
        picture = samples.png()
        db.media.attach(sent.id, [{"sha256": files.put(picture), "name": "a.png", "mime": "image/png",
                                   "size": len(picture), "kind": "image"}])
    runner = CliRunner()
    report = runner.invoke(storage_cmd, ["--home", str(home)])
    assert report.exit_code == 0, report.output
    assert (f"Media folder {home / 'media'}: 1 file, {len(picture)} B (pictures, voice and documents; 1 message "
            "reference)") in report.output
    doc = __import__("json").loads(runner.invoke(storage_cmd, ["--home", str(home), "--json"]).output)
    assert {k: doc["media"][k] for k in ("files", "bytes", "references")} == {"files": 1, "bytes": len(picture),
                                                                               "references": 1}
    said = runner.invoke(backup_cmd, [str(tmp_path / "b.db"), "--home", str(home)])
    assert said.exit_code == 0, said.output
    assert f"the media folder is not in b.db: 1 file ({len(picture)} bytes) in {home / 'media'}" in said.output
    copied = runner.invoke(backup_cmd, [str(tmp_path / "c.db"), "--home", str(home), "--media", str(tmp_path / "m")])
    assert "copied 1 media file" in copied.output
    assert list(MediaFiles(tmp_path / "m").hashes()) == list(files.hashes())
    again = runner.invoke(backup_cmd, [str(tmp_path / "d.db"), "--home", str(home), "--media", str(tmp_path / "m")])
    assert "copied 0 media files (0 bytes)" in again.output


def test_recall_finds_a_documents_text_for_its_owner_only(store):
    store.sessions.create("mine", "telegram", user_id="1")
    store.sessions.create("theirs", "telegram", user_id="2")
    for sid in ("mine", "theirs"):
        sent = store.messages.append_inbound(sid, "[attached document: plan.pdf]", platform_message_id="1")
        store.media.attach(sent.id, [{"sha256": "d" * 64, "name": "plan.pdf", "mime": "application/pdf", "size": 9,
                                      "kind": "document", "text": "The zeppelin hangar opens in March"}])
    found = store.recall.hits("zeppelin hangar", agent_prefix=None, accounts=["telegram:1"])
    assert [(h["session_id"], h["snippet"].split("]")[0]) for h in found["hits"]] == [("mine", "[plan.pdf")]
    everyone = store.recall.hits("zeppelin", agent_prefix=None, accounts=None)
    assert sorted(h["session_id"] for h in everyone["hits"]) == ["mine", "theirs"]
    [session] = store.recall.sessions(["mine"])  # what recall summarizes: the document's text with its message
    assert session["messages"][0]["content"] == ("[attached document: plan.pdf]\n[plan.pdf:]\n"
                                                 "The zeppelin hangar opens in March")


async def test_compression_is_shown_what_a_folded_picture_was_and_told_to_keep_it(tmp_path):
    from compression.prompt import SYSTEM_PROMPT, render_transcript

    async with await AsyncSessionDB.open(tmp_path / "state.db") as db:
        media = MediaService(db, MediaFiles(tmp_path / "media"))
        await db.sessions.create("s", "telegram")
        sent = await db.messages.append_inbound("s", "my cat\n[attached image: photo.jpg]", platform_message_id="1")
        await media.keep(sent.id, [Attachment("image", "photo.jpg", "image/jpeg", data=samples.png())])
        await db.media.set_text(sha256_of(samples.png()), "A ginger cat asleep on a red sofa.")
        history = await media.expand("s", [{"role": "user", "content": "my cat\n[attached image: photo.jpg]"}],
                                     vision=True)
    transcript = render_transcript(history)
    assert "[image photo.jpg: A ginger cat asleep on a red sofa.]" in transcript
    assert "[image: the picture itself is not shown here" in transcript
    assert "keep one short line: its name and what it showed or said" in SYSTEM_PROMPT


def test_describe_with_must_name_a_model_with_vision():
    from gateway.config import config_from_dict
    from gateway.errors import ConfigError

    ok = config_from_dict({"models": {"eyes": {"base_url": "http://127.0.0.1:1/v1", "name": "e", "vision": True}},
                           "media": {"describe_with": "eyes"}})
    assert ok.media.describe_with == "eyes" and ok.media_path == ok.home / "media"
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"models": {"blind": {"base_url": "http://127.0.0.1:1/v1", "name": "b"}},
                          "media": {"describe_with": "blind"}})
    assert "media.describe_with" in str(refused.value) and "'blind' is not a model with vision" in str(refused.value)


async def test_a_document_that_takes_too_long_to_read_is_kept_without_its_text(tmp_path):
    async with await AsyncSessionDB.open(tmp_path / "state.db") as db:
        media = MediaService(db, MediaFiles(tmp_path / "media"), read_timeout=1e-6)
        kept = await media.keep(None, [Attachment("document", "long.pdf", "application/pdf",
                                                  data=samples.pdf("page one"))])
    assert [(i["name"], i["text"]) for i in kept.items] == [("long.pdf", None)]
    assert kept.notes == ("long.pdf took too long to read (over 1e-06 s); only its name reaches the model.",)


async def test_with_images_in_context_0_a_picture_goes_only_with_its_own_message(tmp_path):
    async with await AsyncSessionDB.open(tmp_path / "state.db") as db:
        media = MediaService(db, MediaFiles(tmp_path / "media"), images_in_context=0)
        await db.sessions.create("s", "telegram")
        sent = await db.messages.append_inbound("s", "[attached image: a.png]", platform_message_id="1")
        await media.keep(sent.id, [Attachment("image", "a.png", "image/png", data=samples.png())])
        asking = [{"role": "user", "content": "[attached image: a.png]"}]
        later = [*asking, {"role": "assistant", "content": "a red square"}, {"role": "user", "content": "and now?"}]
        assert [p["type"] for p in (await media.expand("s", asking, vision=True))[0]["content"]] == ["text", "image_url"]
        assert (await media.expand("s", later, vision=True))[0] == asking[0]


def test_sessions_search_finds_a_documents_text(store):
    store.sessions.create("s", "telegram")
    sent = store.messages.append_inbound("s", "[attached document: menu.pdf]", platform_message_id="1")
    store.media.attach(sent.id, [{"sha256": "e" * 64, "name": "menu.pdf", "mime": "application/pdf", "size": 9,
                                  "kind": "document", "text": "Soup of the day: pumpkin"}])
    [hit] = store.search.messages("pumpkin soup")
    assert (hit["id"], hit["session_id"]) == (sent.id, "s") and hit["snippet"].startswith("[menu.pdf] ")
    assert store.search.messages("pumpkin", source_filter=["slack"]) == []


def test_sessions_prune_deletes_the_files_of_the_sessions_it_prunes(tmp_path):
    from click.testing import CliRunner

    from gateway.cli.sessions import sessions

    home = tmp_path / "home"
    files = MediaFiles(home / "media")
    with SessionDB(home / "state.db") as db:
        for sid, data in (("ended", b"old notes"), ("open", b"current notes")):
            db.sessions.create(sid, "telegram")
            sent = db.messages.append_inbound(sid, "[attached document: notes.txt]", platform_message_id="1")
            db.media.attach(sent.id, [{"sha256": files.put(data), "name": "notes.txt", "mime": "text/plain",
                                       "size": len(data), "kind": "document", "text": data.decode()}])
        db.sessions.end("ended", "reset")
    result = CliRunner().invoke(sessions, ["prune", "--older-than", "0", "--yes", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert "pruned 1 session" in result.output and "deleted 1 media file (9 bytes)" in result.output
    assert list(files.hashes()) == [sha256_of(b"current notes")]
