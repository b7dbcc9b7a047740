"""The state store: sessions and messages in one shared SQLite database (WAL).

    from state import SessionDB
    db = SessionDB()            # $SWITCHBOARD_HOME/state.db, ~/.switchboard by default
    sid = db.sessions.create(new_session_id(), "telegram", model="gpt-4o")
    db.messages.append(sid, "user", "hello")

The daemon uses :class:`AsyncSessionDB` (same methods, as coroutines).
``state`` imports nothing from ``gateway``, ``adapters`` or ``compression``.
"""

from ._fence import Fence, Handback
from ._hermes import HermesStore, read_hermes
from ._integrity import IntegrityChecker
from ._messages import Appended
from ._pg import mask_url, probe as probe_store
from ._split import Split
from ._storage import ObjectSize, SessionSize, StorageReport, TextSize
from ._transfer import parse_jsonl
from ._turns import ContextQuery, FactsChoice, FactsOwner, TurnContext
from ._upkeep import WAL_LIMIT_BYTES, StoreSize, UpkeepReport, run_upkeep, vacuum_database
from .aio import AsyncSessionDB
from .db import SessionDB
from .errors import (
    AmbiguousSession,
    CronJobExists,
    CronJobNotFound,
    DatabaseRefused,
    ImportFileError,
    InvalidTitle,
    MigrationRefused,
    NotADatabase,
    NotAHermesStore,
    PairingNotFound,
    SchemaTooNew,
    SessionChangedMeanwhile,
    SessionNotFound,
    StateError,
    StoreCorrupt,
    StoreUnavailable,
    TitleConflict,
    WriteTimeout,
)
from .inspect import DatabaseReport, inspect_database
from .paths import default_db_path, default_home, new_session_id
from .records import DeliveryRecord, Session, StoredMessage

__all__ = [
    "AmbiguousSession",
    "Appended",
    "ContextQuery",
    "AsyncSessionDB",
    "CronJobExists",
    "CronJobNotFound",
    "DatabaseReport",
    "DatabaseRefused",
    "DeliveryRecord",
    "FactsChoice",
    "FactsOwner",
    "Fence",
    "Handback",
    "ImportFileError",
    "IntegrityChecker",
    "InvalidTitle",
    "MigrationRefused",
    "NotADatabase",
    "NotAHermesStore",
    "ObjectSize",
    "PairingNotFound",
    "SchemaTooNew",
    "Session",
    "SessionChangedMeanwhile",
    "SessionDB",
    "SessionNotFound",
    "SessionSize",
    "Split",
    "StateError",
    "StorageReport",
    "StoreCorrupt",
    "StoreSize",
    "StoreUnavailable",
    "StoredMessage",
    "UpkeepReport",
    "TextSize",
    "TitleConflict",
    "TurnContext",
    "WriteTimeout",
    "default_db_path",
    "default_home",
    "inspect_database",
    "mask_url",
    "probe_store",
    "new_session_id",
    "parse_jsonl",
    "read_hermes",
    "HermesStore",
    "run_upkeep",
    "WAL_LIMIT_BYTES",
    "vacuum_database",
]
