"""``SessionDB``: the synchronous face of the store (the CLI, cron runs, tests).

The store's features hang off it as repositories (``state._repo``), each in the feature's own
module: ``db.sessions`` (``state._sessions``), ``db.messages`` (``_messages``), ``db.titles``,
``db.routes``, ``db.compression`` (``_split``), ``db.search`` (``state.search``), ``db.recall``,
``db.recovery``, ``db.dead_letters``, ``db.prefs``, ``db.facts``, ``db.cron``, ``db.usage``,
``db.pairing``, ``db.transfer``, ``db.storage`` and ``db.upkeep``.  Each public method of a
repository is one call to a function of its module through the engine, marked ``@reads``,
``@writes`` or ``@upkeep_steps``; :class:`state.AsyncSessionDB` builds its coroutines from those
marks, so the daemon runs exactly this code.  SessionDB itself keeps what concerns the whole store:
where it is, its engine, the cluster, the write timeout, checkpoints and closing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

from . import _titles
from ._a2a import A2aTasks
from ._approvals import Approvals
from ._budgets import Budgets
from ._cron import CronJobs
from ._deadletters import DeadLetters
from ._engine import Engine
from ._facts import Facts
from ._fence import Fence
from ._mcp_auth import McpAuthStore
from ._media import Media
from ._messages import Messages
from ._pairing import Pairing
from ._pg import PgEngine, is_url, mask_url
from ._prefs import ChatPrefs
from ._questions import Questions
from ._recall import Recall
from ._receipts import Receipts
from ._recovery import Recovery
from ._replays import Replays
from ._repo import Repository, marked_methods, reads as _reads
from ._routes import Routes
from ._sessions import Sessions
from ._split import Compression
from ._storage import Storage
from ._titles import Titles
from ._toolcalls import ToolJournal
from ._transfer import Transfer
from ._turns import Turns
from ._upkeep import Upkeep
from ._usage import UsageLedger
from ._voice import VoiceMessages
from .errors import StateError, StoreCorrupt
from .paths import default_db_path
from .search import Search

if TYPE_CHECKING:
    from .cluster.store import ClusterStore


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
        "sessions": Sessions,
        "messages": Messages,
        "titles": Titles,
        "routes": Routes,
        "compression": Compression,
        "search": Search,
        "recall": Recall,
        "recovery": Recovery,
        "dead_letters": DeadLetters,
        "prefs": ChatPrefs,
        "facts": Facts,
        "cron": CronJobs,
        "usage": UsageLedger,
        "pairing": Pairing,
        "transfer": Transfer,
        "storage": Storage,
        "upkeep": Upkeep,
        "tool_journal": ToolJournal,
        "voice": VoiceMessages,
        "budgets": Budgets,
        "approvals": Approvals,
        "questions": Questions,
        "replays": Replays,
        "receipts": Receipts,
        "media": Media,
        "a2a": A2aTasks,
        "mcp_auth": McpAuthStore,
        "turns": Turns,
    }
    sessions: Sessions
    messages: Messages
    titles: Titles
    routes: Routes
    compression: Compression
    search: Search
    recall: Recall
    recovery: Recovery
    dead_letters: DeadLetters
    prefs: ChatPrefs
    facts: Facts
    cron: CronJobs
    usage: UsageLedger
    pairing: Pairing
    transfer: Transfer
    storage: Storage
    upkeep: Upkeep
    tool_journal: ToolJournal
    voice: VoiceMessages
    budgets: Budgets
    approvals: Approvals
    questions: Questions
    replays: Replays
    receipts: Receipts
    media: Media
    a2a: A2aTasks
    mcp_auth: McpAuthStore
    turns: Turns

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

    def refuse_writes(self, problems: Iterable[str]) -> StoreCorrupt:
        """Every write from now on raises :class:`StoreCorrupt`, reads go on (the integrity guard found
        the SQLite file damaged); returns that error.  PostgreSQL checks its own pages."""
        if not isinstance(self._engine, Engine):
            raise StateError("only a SQLite store is checked by the integrity guard")
        return self._engine.refuse_writes(list(problems))

    @property
    def writes_refused(self) -> StoreCorrupt | None:
        """The error every write raises since the file was found damaged; None while writes go on."""
        return self._engine.writes_refused if isinstance(self._engine, Engine) else None

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> "SessionDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SessionDB({self.url or str(self.db_path)!r})"

    @staticmethod
    def sanitize_title(title: str | None) -> str | None:
        """A title as it would be stored (see ``state._titles``); it touches no database."""
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
