"""Voice messages: a stored user message's text replaced by its transcript.

A voice message is stored when it arrives (the text says it waits for its transcript), before
anything that can fail; once transcribed, or once the transcription failed, its text is set here.
The FTS triggers (SQLite) and the search column (PostgreSQL) follow the update, so recall finds
what was said.  No table of its own: the transcript is the message's text.

**Locks (PostgreSQL, writes at READ COMMITTED).**  A transcript is one ``UPDATE``.  No lock of its
own.
"""

from __future__ import annotations

import sqlite3

from ._repo import Repository, writes


def set_user_text(conn: sqlite3.Connection, message_id: int, text: str) -> bool:
    cur = conn.execute("UPDATE messages SET content = $1 WHERE id = $2 AND role = 'user'", (text, message_id))
    return cur.rowcount > 0


class VoiceMessages(Repository):
    """``db.voice``: the text of a stored voice message, once it is known."""

    @writes
    def set_text(self, message_id: int, text: str) -> bool:
        """Set user message ``message_id``'s text (its transcript, or why there is none); False: no such message."""
        return self._engine.write(set_user_text, message_id, text)
