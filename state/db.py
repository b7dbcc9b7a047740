"""``SessionDB``: the synchronous face of the store (the CLI, cron runs, tests).

Each public method is one call to a function of ``state._sessions``,
``_messages``, ``_titles``, ``_routes``, ``_transfer``, ``_pairing``, ``_recall``,
``_cron``, ``_facts``, ``_recovery``, ``_deadletters``, ``_upkeep``, ``_usage``, ``_storage``
or ``search`` through the engine, marked ``@_reads`` or ``@_writes``.  The features that have
moved to repositories (``state._repo``) hang off the store instead: ``db.prefs``.  :class:`state.AsyncSessionDB` builds its
coroutines from those marks, so the daemon runs exactly this code.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, TypeVar

from . import (
    _sessions,
    _titles,
)
from ._cron import CronJobs
from ._deadletters import DeadLetters
from ._engine import Engine
from ._facts import Facts
from ._fence import Fence
from ._messages import Messages
from ._pairing import Pairing
from ._pg import PgEngine, is_url, mask_url
from ._prefs import ChatPrefs
from ._recall import Recall
from ._recovery import Recovery
from ._repo import Repository, marked_methods, reads as _reads, writes as _writes
from ._routes import Routes
from ._split import Compression
from ._storage import Storage
from ._titles import Titles
from ._transfer import Transfer
from ._upkeep import Upkeep
from ._usage import UsageLedger
from .paths import default_db_path
from .search import Search

if TYPE_CHECKING:
    from .cluster.store import ClusterStore

T = TypeVar("T")


class SessionDB:
    """Sessions and messages in one SQLite database in WAL mode, shared by every process, or in
    one PostgreSQL database shared by every instance.

    ``db_path`` is a SQLite file (default ``$SWITCHBOARD_HOME/state.db``) or a
    ``postgresql://user:password@host:5432/db`` URL (``state._pg``: the same methods, the
    same answers).  A write waits for other writers up to ``write_timeout`` seconds, then
    raises :class:`state.WriteTimeout` having written nothing.  Safe to share between
    threads: writes are serialised, each reading thread gets its own connection.
    """

    MAX_TITLE_LENGTH = _titles.MAX_TITLE_LENGTH

    #: the features' repositories (``state._repo``), by the attribute each hangs off: ``db.prefs``...
    REPOSITORIES: ClassVar[dict[str, type[Repository]]] = {
        "prefs": ChatPrefs,
        "messages": Messages,
        "compression": Compression,
        "recall": Recall,
        "search": Search,
        "titles": Titles,
        "routes": Routes,
        "transfer": Transfer,
        "storage": Storage,
        "upkeep": Upkeep,
        "recovery": Recovery,
        "facts": Facts,
        "cron": CronJobs,
        "usage": UsageLedger,
        "pairing": Pairing,
        "dead_letters": DeadLetters,
    }
    prefs: ChatPrefs
    messages: Messages
    compression: Compression
    recall: Recall
    search: Search
    titles: Titles
    routes: Routes
    transfer: Transfer
    storage: Storage
    upkeep: Upkeep
    recovery: Recovery
    facts: Facts
    cron: CronJobs
    usage: UsageLedger
    pairing: Pairing
    dead_letters: DeadLetters

    def __init__(self, db_path: Path | str | None = None, *, write_timeout: float = 10.0):
        self._engine: Engine | PgEngine
        if is_url(db_path):
            #: the store's URL with its password masked (None for SQLite); never the password
            self.url: str | None = mask_url(str(db_path))
            self.db_path: Path | None = None
            self._engine = PgEngine(str(db_path), write_timeout=write_timeout)
        else:
            self.url = None
            self.db_path = Path(db_path) if db_path is not None else default_db_path()
            self._engine = Engine(self.db_path, write_timeout=write_timeout)
        for name, repository in self.REPOSITORIES.items():
            setattr(self, name, repository(self._engine, file=self.db_path, url=self.url))

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return "postgresql" if self.url is not None else "sqlite"

    @property
    def cluster(self) -> ClusterStore | None:
        """The cluster's owners, cron ticks, leases and rate budgets on this PostgreSQL store
        (:class:`state.cluster.ClusterStore`); None on SQLite, where one instance uses a file alone."""
        return self._engine.cluster if isinstance(self._engine, PgEngine) else None

    @property
    def write_timeout(self) -> float:
        """Seconds a write waits for other writers before :class:`state.WriteTimeout`."""
        return self._engine.write_timeout

    @write_timeout.setter
    def write_timeout(self, seconds: float) -> None:
        self._engine.write_timeout = float(seconds)

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> "SessionDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SessionDB({self.url or str(self.db_path)!r})"

    # --- sessions ------------------------------------------------------------

    @_writes
    def create_session(
        self,
        session_id: str,
        source: str,
        model: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        *,
        system_prompt: str | None = None,
        model_config: Any = None,
        session_key: str | None = None,
        user_name: str | None = None,
        title: str | None = None,
    ) -> str:
        """Create a session and return its id; an id that exists already is left as it is."""
        return self._engine.write(
            _sessions.create_session, session_id, source, model, user_id, parent_session_id,
            system_prompt=system_prompt, model_config=model_config, session_key=session_key,
            user_name=user_name, title=title,
        )

    @_writes
    def end_session(self, session_id: str, end_reason: str) -> bool:
        """Mark the session ended; the first end wins.  True if this call ended it."""
        return self._engine.write(_sessions.end_session, session_id, end_reason)

    @_writes
    def reopen_session(self, session_id: str) -> bool:
        """Clear ``ended_at`` and ``end_reason``.  False if the session does not exist."""
        return self._engine.write(_sessions.reopen_session, session_id)

    @_writes
    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> bool:
        return self._engine.write(_sessions.update_system_prompt, session_id, system_prompt)

    @_writes
    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        *,
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        model: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
    ) -> bool:
        """Add to the session's token counts and costs; set the billing labels given; ``model``
        only fills in a session that has none (the session keeps the model it was created for)."""
        return self._engine.write(
            _sessions.update_token_counts, session_id,
            input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens, reasoning_tokens=reasoning_tokens,
            estimated_cost_usd=estimated_cost_usd, actual_cost_usd=actual_cost_usd, model=model,
            billing_provider=billing_provider, billing_base_url=billing_base_url, billing_mode=billing_mode,
            cost_status=cost_status, cost_source=cost_source, pricing_version=pricing_version,
        )

    @_reads
    def get_session(self, session_id: str) -> dict | None:
        return self._engine.read(_sessions.get_session, session_id)

    @_reads
    def resolve_session_id(self, prefix_or_title: str) -> str:
        """Exact id, unique id prefix, or title (newest of its lineage).

        Raises :class:`state.AmbiguousSession` (with ``candidates``) or
        :class:`state.SessionNotFound`.
        """
        return self._engine.read(_sessions.resolve_session_id, prefix_or_title)

    @_reads
    def resolve_session_exactly(self, ref: str) -> str:
        """Exact id, exact title, or a unique id prefix (for delete and rename: never another of a lineage).

        Raises :class:`state.AmbiguousSession` (every candidate, including ``ref #N``
        when no session is titled ``ref`` itself) or :class:`state.SessionNotFound`.
        """
        return self._engine.read(_sessions.resolve_session_exactly, ref)

    @_reads
    def find_owned_session(self, ref: str, *, source: str, user_ids: Iterable[str]) -> tuple[str | None, list[str]]:
        """``ref`` (id, id prefix or title) among the sessions of ``source`` owned by ``user_ids`` only:
        ``(id, [])``, ``(None, candidate ids)`` for an ambiguous prefix, or ``(None, [])``."""
        return self._engine.read(_sessions.find_owned_session, ref, source=source, user_ids=list(user_ids))

    @_reads
    def list_sessions_rich(
        self,
        source: str | None = None,
        limit: int = 20,
        offset: int = 0,
        include_children: bool = False,
        user_ids: Iterable[str] | None = None,
        session_key: str | None = None,
        *,
        user: str | None = None,
        title_contains: str | None = None,
        active_since: float | None = None,
        active_before: float | None = None,
    ) -> list[dict]:
        """Newest first, with ``preview`` and ``last_active``; a compression chain is one row (its tip).
        ``user`` (id or name), ``title_contains`` and the last activity's range narrow the list."""
        return self._engine.read(
            _sessions.list_sessions_rich, source, limit, offset, include_children,
            list(user_ids) if user_ids is not None else None, session_key, user=user,
            title_contains=title_contains, active_since=active_since, active_before=active_before,
        )

    @_reads
    def session_count(self, source: str | None = None) -> int:
        return self._engine.read(_sessions.session_count, source)

    @_reads
    def get_lineage(self, session_id: str) -> list[dict]:
        """Ancestors from the root down to the session itself."""
        return self._engine.read(_sessions.get_lineage, session_id)

    @_reads
    def get_descendants(self, session_id: str) -> list[dict]:
        """Every session below this one, oldest first."""
        return self._engine.read(_sessions.get_descendants, session_id)

    @_reads
    def get_compression_tip(self, session_id: str) -> str:
        """The live end of a compression chain (the id itself when it was not compressed)."""
        return self._engine.read(_sessions.get_compression_tip, session_id)

    @_writes
    def delete_session(self, session_id: str) -> bool:
        """Delete a session, its messages and routes; children stay with no parent."""
        return self._engine.write(_sessions.delete_session, session_id)

    @_reads
    def prune_candidates(self, older_than_days: float = 90, source: str | None = None) -> list[str]:
        """The ids :meth:`prune_sessions` would delete now."""
        return self._engine.read(_sessions.prune_candidates, older_than_days, source)

    @_writes
    def prune_sessions(self, older_than_days: float = 90, source: str | None = None) -> int:
        """Delete ended sessions with no activity for ``older_than_days``; returns how many."""
        return self._engine.write(_sessions.prune_sessions, older_than_days, source)

    # --- titles ----------------------------------------------------------------

    @staticmethod
    def sanitize_title(title: str | None) -> str | None:
        return _titles.sanitize_title(title)















    def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """Run a WAL checkpoint; returns SQLite's (busy, wal pages, checkpointed pages)."""
        return self._engine.checkpoint(mode)

    @_reads
    def checkpoint_aside(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """A checkpoint that leaves the write connection free (the async store runs it on a
        reader thread, so no write queues behind it); returns (busy, wal pages, checkpointed)."""
        return self._engine.checkpoint_aside(mode)



















def public_methods(kind: str) -> dict[str, Callable[..., Any]]:
    """SessionDB's own methods marked ``kind`` ("read", "write" or "upkeep"), by name (the
    repositories' are found with :func:`state._repo.marked_methods` on each)."""
    return marked_methods(SessionDB, kind)


__all__ = ["Fence", "SessionDB", "public_methods"]
