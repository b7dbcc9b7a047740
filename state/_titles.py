"""Session titles: cleaning, uniqueness and ``title #N`` lineages.

**Locks (PostgreSQL, writes at READ COMMITTED).**  Whether a title is free, and the next number of a
lineage, are read from rows other sessions hold (case-insensitive ``LIKE`` over all titles), so no row
lock can cover them: every write that sets a title first takes the one ``titles`` advisory lock
(:func:`lock_titles`).  Titles are set rarely (a rename, a split), so taking turns costs nothing, and
two sessions given one title at once get a :class:`TitleConflict`, not a unique-index error.
"""

from __future__ import annotations

import re
import sqlite3

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from .errors import AmbiguousSession, InvalidTitle, TitleConflict

MAX_TITLE_LENGTH = 100

# C0/C1 controls except the whitespace we fold into spaces below
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# zero-width characters, bidi embeddings/overrides/isolates, BOM, object replacement
_INVISIBLE = re.compile("[\u200b-\u200f\u2028-\u202e\u2060-\u2069\u061c\u180e\ufeff\ufff9-\ufffc]")
_SPACES = re.compile(r"\s+")
_NUMBERED = re.compile(r"^(.*?) #(\d+)$")


def sanitize_title(title: str | None) -> str | None:
    """Strip invisible and control characters, fold whitespace; empty becomes None.

    Raises :class:`InvalidTitle` when more than 100 characters remain.
    """
    if title is None:
        return None
    cleaned = _INVISIBLE.sub("", _CONTROL.sub("", str(title)))
    cleaned = _SPACES.sub(" ", cleaned).strip()
    if not cleaned:
        return None
    if len(cleaned) > MAX_TITLE_LENGTH:
        raise InvalidTitle(f"{len(cleaned)} characters, at most {MAX_TITLE_LENGTH}: shorten it")
    return cleaned


def like_escape(text: str) -> str:
    """Escape LIKE wildcards; use with ``ESCAPE '\\'``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def lock_titles(conn: sqlite3.Connection) -> None:
    """Before a write reads which titles are taken (see the module docstring)."""
    dialect_of(conn).serialize(conn, "titles")


def check_free(conn: sqlite3.Connection, title: str, session_id: str) -> None:
    """Raise :class:`TitleConflict` when another session holds ``title``; in a write, the titles locked first."""
    lock_titles(conn)
    row = conn.execute("SELECT id FROM sessions WHERE title = $1 AND id != $2", (title, session_id)).fetchone()
    if row:
        raise TitleConflict(title, row[0])


def set_session_title(conn: sqlite3.Connection, session_id: str, title: str | None) -> bool:
    clean = sanitize_title(title)
    if clean:
        check_free(conn, clean, session_id)
    return conn.execute("UPDATE sessions SET title = $1 WHERE id = $2", (clean, session_id)).rowcount > 0


def get_session_title(conn: sqlite3.Connection, session_id: str) -> str | None:
    row = conn.execute("SELECT title FROM sessions WHERE id = $1", (session_id,)).fetchone()
    return row[0] if row else None


def get_session_by_title(conn: sqlite3.Connection, title: str) -> dict | None:
    row = conn.execute("SELECT * FROM sessions WHERE title = $1", (title,)).fetchone()
    return dict(row) if row else None


def lineage_rows(conn: sqlite3.Connection, base: str) -> list[sqlite3.Row]:
    """The session titled ``base`` and those titled ``base #N``, newest first."""
    rows = conn.execute(
        "SELECT id, title, started_at FROM sessions WHERE title = $1 OR title LIKE $2 ESCAPE '\\' "
        "ORDER BY started_at DESC, id DESC",
        (base, like_escape(base) + " #%"),
    ).fetchall()
    exact = re.compile(re.escape(base) + r"(?: #\d+)?")
    return [r for r in rows if exact.fullmatch(r["title"])]


CASE_HINT = "give the id, or the title as it is written"


def lineage_rows_any_case(conn: sqlite3.Connection, base: str, where: str = "", params: tuple = ()) -> list:
    """The sessions titled ``base`` or ``base #N`` in any case, newest first (``where``: more conditions,
    ``AND ...``, their ``params`` numbered from ``$3``).  The database folds ASCII letters (SQLite's
    ``lower``); the check after it, Python's."""
    rows = conn.execute(
        "SELECT id, title, started_at FROM sessions WHERE (lower(title) = lower($1) OR lower(title) LIKE lower($2) "
        f"ESCAPE '\\'){where} ORDER BY started_at DESC, id DESC",
        (base, like_escape(base) + " #%", *params),
    ).fetchall()
    lineage = re.compile(re.escape(base) + r"(?: #\d+)?", re.IGNORECASE)
    return [r for r in rows if lineage.fullmatch(r["title"])]


def _base(title: str) -> str:
    """``title`` without its `` #N``."""
    numbered = _NUMBERED.match(title)
    return numbered.group(1) if numbered else title


def newest_of_one_lineage(rows: list, ref: str) -> str | None:
    """The newest of ``rows`` (newest first) when they are one lineage; several lineages whose titles differ
    only in case (``Chat``, ``chat #2``) raise :class:`AmbiguousSession` listing them."""
    if not rows:
        return None
    bases = {_base(r["title"]) for r in rows}
    if len(bases) > 1:
        raise AmbiguousSession(ref, [r["id"] for r in rows], CASE_HINT)
    return rows[0]["id"]


def resolve_session_by_title(conn: sqlite3.Connection, title: str) -> str | None:
    """The newest session of the lineage ``title``, ``title #2``, ``title #3`` ...; a title as written
    first, else in any case (``my first chat`` finds ``My first chat``; two lineages that fit raise
    :class:`AmbiguousSession`)."""
    clean = sanitize_title(title)
    if not clean:
        return None
    rows = lineage_rows(conn, clean)
    if rows:
        return rows[0]["id"]
    return newest_of_one_lineage(lineage_rows_any_case(conn, clean), title)


def get_next_title_in_lineage(conn: sqlite3.Connection, base_title: str) -> str:
    """``base`` if free, else ``base #N`` one past the highest number in use."""
    clean = sanitize_title(base_title) or ""
    match = _NUMBERED.match(clean)
    base = match.group(1) if match else clean
    rows = lineage_rows(conn, base)
    if not rows:
        return base
    highest = 1
    for row in rows:
        numbered = _NUMBERED.match(row["title"])
        if numbered and numbered.group(1) == base:
            highest = max(highest, int(numbered.group(2)))
    return f"{base} #{highest + 1}"


class Titles(Repository):
    """``db.titles``: session titles, unique among open lineages (``title``, ``title #2``...)."""

    @reads
    def get(self, session_id: str) -> str | None:
        return self._engine.read(get_session_title, session_id)

    @reads
    def session(self, title: str) -> dict | None:
        return self._engine.read(get_session_by_title, title)

    @reads
    def resolve(self, title: str) -> str | None:
        """The newest session titled ``title`` or ``title #N``; None if there is none."""
        return self._engine.read(resolve_session_by_title, title)

    @reads
    def next_in_lineage(self, base_title: str) -> str:
        """``base`` if unused, else ``base #N`` one past the highest in use."""
        return self._engine.read(get_next_title_in_lineage, base_title)

    @writes
    def set(self, session_id: str, title: str | None) -> bool:
        """Set (or clear, with an empty title) the title.  False if the session does not exist.

        Raises :class:`state.TitleConflict` naming the holder, or :class:`state.InvalidTitle`.
        """
        return self._engine.write(set_session_title, session_id, title)
