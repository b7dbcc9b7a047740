"""The seam between the store and its full-text index: what every engine's index answers.

Two implementations, one per engine, chosen by the engine's dialect (``state._dialect``):
``state.search.fts5`` (SQLite's FTS5 tables) and ``state.search.tsvector`` (PostgreSQL's
``tsvector`` and ``pg_trgm`` indexes).  A parsed query (``state.search._query``) goes in, the same
answers come out on both; the store's other modules (recall, facts, upkeep) only ever ask this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from ._query import Node


@dataclass(frozen=True, slots=True)
class MergeStep:
    worked: int  # rows FTS5 changed (leaves written, input pages dropped, its index): 0 when nothing to merge
    left: int  # how many of the segments the merge started from are still there


class SearchIndex(Protocol):
    """What the store asks of an engine's search index.  ``where``/``args``: extra conditions on ``m``
    (messages) and, with ``need_s``, on ``s`` (sessions), their parameters ``$1 ... $len(args)`` (an
    index numbers its statement's own parameters after them)."""

    name: str

    def install(self, conn: Any) -> None:
        """Create the index (schema step v11); idempotent, inside the migration's transaction."""

    def search(self, conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int, window: int,
               context_chars: int | None = None) -> list[dict]:
        """The best ``limit`` of the newest ``window`` matches, best first, as hits (``id``,
        ``session_id``, ``role``, ``timestamp``, ``source``, ``model``, ``session_started``,
        ``snippet``, ``score``: higher is better, comparable with :meth:`search_media`'s); with
        ``context_chars``, each with its ``context`` (the messages around it)."""
        ...

    def install_media(self, conn: Any) -> None:
        """Create the documents' index over ``message_media.text`` (schema step v30), kept in step with
        its rows (inserts, text set later, deletes and their messages' cascades)."""

    def search_media(self, conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int,
                     window: int) -> list[dict]:
        """Messages whose files' text (a document's, a picture's description, a transcript) matches,
        ranked by the rules :meth:`search` ranks messages by, each message once: hits as :meth:`search`'s
        (no ``context``), the snippet led by ``[file name]``, each with the ``score`` it was ranked by and
        the ``position`` of the file that matched best."""
        ...

    def matching_ids(self, conn: Any, tree: Node, where: str, args: list, need_s: bool, limit: int) -> list[int]:
        """The newest ``limit`` messages that match, newest first."""
        ...

    def newest_in(self, conn: Any, tree: Node, ids: list[int], limit: int) -> list[int]:
        """The newest ``limit`` of the messages ``ids`` that match, newest first (one user's scope)."""
        ...

    def texts(self, conn: Any, ids: Sequence[int]) -> dict[int, tuple]:
        """The searched text of these messages: id -> (content, tool name, tool calls' text)."""
        ...

    def fact_candidates(self, conn: Any, owner: str, words: list[str], *, limit: int, include_superseded: bool,
                        window: int) -> list:
        """The owner's facts matching any of ``words`` among its newest ``window`` matches, best first: rows
        of ``facts`` with ``fts_rank`` (lower is better)."""
        ...

    def install_facts(self, conn: Any) -> None:
        """Create the facts' index (schema step v15), after their tables."""

    def segments(self, conn: Any, table: str) -> list[int]:
        """The segments the index ``table`` holds now (upkeep merges them; none where there is nothing to merge)."""
        ...

    def merge_step(self, conn: Any, table: str, pages: int, segments: list[int] | None, start: bool) -> MergeStep:
        """Merge about ``pages`` pages of the index ``table`` (see ``state.search.fts5.merge_step``)."""
        ...

    def set_automerge(self, conn: Any, on: bool) -> None:
        """Turn the index's own merging on or off (upkeep does it in small steps while it prunes)."""
        ...
