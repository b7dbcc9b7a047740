"""state.db size per 1,000 media messages, everything else in the media folder.

    .venv/bin/python bench/media.py [--messages 1000] [--kb 200] [--documents-every 4]

Stores ``--messages`` user messages in one SQLite store the way the gateway does (the picture or
document to the media folder, ``gateway.media.MediaService.keep``; the message with its reference),
one in ``--documents-every`` a PDF with about 1.5 KB of text (its text stored once with its reference:
what the model and recall read, so it stays in the database), the others pictures of ``--kb`` KB.  Prints state.db's size (after a
checkpoint), per 1,000 media messages, the largest value in any column, and the media folder's
size.  Target: state.db under 1 MB per 1,000 media messages.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.media import MediaService
from gateway.types import Attachment
from state import AsyncSessionDB
from state.media_files import MediaFiles
from tests.fakes import files as samples

PAGE = ("Quarterly figures for the northern depot: deliveries rose by four per cent, returns fell, and the "
        "new loading bay opened on time. ") * 20  # about 2.6 KB of text, one page


def _picture(i: int, kb: int) -> bytes:
    head = samples.png(4, 4, rgb=(i % 256, (i // 256) % 256, 99))
    return head + os.urandom(max(0, kb * 1024 - len(head)))  # a PNG header, then incompressible bytes


async def run(messages: int, kb: int, home: Path, documents_every: int = 4) -> None:
    files = MediaFiles(home / "media")
    started = time.perf_counter()
    async with await AsyncSessionDB.open(home / "state.db") as db:
        media = MediaService(db, files)
        await db.sessions.create("bench", "telegram")
        for i in range(messages):
            if documents_every and i % documents_every == documents_every - 1:
                attachment = Attachment("document", f"report-{i}.pdf", "application/pdf",
                                        data=samples.pdf(f"Report {i}. {PAGE[:1500]}"))
            else:
                attachment = Attachment("image", "photo.jpg", "image/png", data=_picture(i, kb))
            sent = await db.messages.append_inbound("bench", f"message {i}\n[attached {attachment.kind}: {attachment.name}]",
                                           platform_message_id=str(i))
            await media.keep(sent.id, [attachment])
            await db.messages.append_many("bench", [{"role": "assistant", "content": f"answer {i}"}])
        await db.checkpoint("TRUNCATE")
    took = time.perf_counter() - started
    size = (home / "state.db").stat().st_size
    with sqlite3.connect(home / "state.db") as conn:
        biggest = 0
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            for column in [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]:
                value = conn.execute(f'SELECT MAX(LENGTH(CAST("{column}" AS BLOB))) FROM "{table}"').fetchone()[0]
                biggest = max(biggest, value or 0)
        text = conn.execute("SELECT COALESCE(SUM(LENGTH(text)), 0) FROM message_media").fetchone()[0]
    count, folder = files.usage()
    pdfs = messages // documents_every if documents_every else 0
    print(f"{messages:,} media messages ({messages - pdfs:,} pictures of {kb} KB, {pdfs:,} PDFs), "
          f"each answered, in {took:.1f} s")
    print(f"state.db: {size / 2**20:.2f} MiB, {size / messages * 1000 / 2**20:.2f} MiB per 1,000 media messages "
          f"(target < 1 MB); largest value in any column: {biggest:,} bytes; the documents' text in it: "
          f"{text / 2**20:.2f} MiB")
    print(f"media folder: {count:,} files, {folder / 2**20:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--kb", type=int, default=200, help="size of each picture")
    parser.add_argument("--documents-every", type=int, default=4, help="one message in N brings a PDF; 0: none")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.messages, args.kb, Path(tmp), args.documents_every))


if __name__ == "__main__":
    main()
