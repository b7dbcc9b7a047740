"""The state store's errors.

    StateError                       root of everything the store raises on purpose
    ├── SessionNotFound              no session has that id, prefix or title
    ├── AmbiguousSession             an id prefix matches several sessions (.candidates)
    ├── InvalidTitle (ValueError)    a title is too long after cleaning
    ├── TitleConflict (ValueError)   another session already holds the title (.holder_session_id)
    ├── SessionChangedMeanwhile      a split found its session changed since it was planned
    │                                (.reason, .new_messages); nothing was written
    ├── DatabaseRefused              the file cannot be opened as our store; it was left untouched
    │   ├── NotADatabase             the file is not a SQLite database, or not a Switchboard one
    │   └── SchemaTooNew             written by a newer Switchboard (.found, .supported)
    ├── WriteTimeout                 another process held the write lock longer than write_timeout
    ├── StoreCorrupt                 the SQLite file failed its integrity check: writes are refused,
    │                                reads still work (.problems); restore a backup
    ├── StoreUnavailable             the PostgreSQL store (store.url, password masked) cannot be reached
    ├── ImportFileError              a line of an import file is malformed (.line_no); nothing imported
    ├── NotAHermesStore              ``sessions import --from-hermes`` was given another file; left untouched
    ├── MigrationRefused             ``switchboard migrate`` cannot or must not copy (says why and what to do)
    ├── PairingNotFound              no pending pairing request has that code (or it expired)
    ├── CronJobNotFound              no scheduled job has that id (.job_id)
    ├── CronJobExists                a scheduled job with that id exists already (.job_id)
    ├── GaveWay                      (state/_lock.py, internal) an upkeep step was interrupted by a
    │                                live write and rolled back; the upkeep pass tries it again
    ├── BadHash (ValueError)         (state/media_files.py) a media file asked for by something that
    │                                is not a SHA-256 in hex: a bug, never a path taken from outside
    └── ClusterError                 (state/cluster/errors.py) a PostgreSQL cluster primitive refused
        ├── OwnershipLost            this instance no longer owns a platform connection: stop it
        ├── LeaseLost                a session's lease is no longer ours; nothing was written
        └── NotInTransaction         a fenced write outside the transaction it guards

Every class above is defined in this module and exported from ``state``,
except ``GaveWay``, which stays next to the write lock
it is about, ``BadHash``, next to the media folder, and
the cluster's, exported from ``state.cluster`` (which needs psycopg).
``TitleConflict`` and ``InvalidTitle`` are also ``ValueError`` so callers
that catch ``ValueError`` for a bad title keep working.  Every message says
what to do next; the CLI prints it as one line.

Outside the tree: ``state/_pg.py``'s ``_NotOneStatement`` is a ``BaseException`` that never leaves the
engine: a read tried as one statement that runs a second is run again in its snapshot, and no
``except Exception`` of a store function may swallow that signal.
"""

from __future__ import annotations


class StateError(Exception):
    """The state store refused or could not do something."""


class SessionNotFound(StateError):
    """No session matches."""

    def __init__(self, ref: str):
        self.ref = ref
        super().__init__(
            f"no session matches {ref!r}: run 'switchboard sessions list' to see ids and titles"
        )


class AmbiguousSession(StateError):
    """An id prefix, or a title written in another case, matches more than one session."""

    def __init__(self, ref: str, candidates: list[str], hint: str = "give more of the id"):
        self.ref = ref
        self.candidates = list(candidates)
        shown = ", ".join(self.candidates[:10])
        more = f" (and {len(self.candidates) - 10} more)" if len(self.candidates) > 10 else ""
        super().__init__(f"{ref!r} matches {len(self.candidates)} sessions: {shown}{more}; {hint}")


class InvalidTitle(StateError, ValueError):
    """A title cannot be stored."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"invalid title: {reason}")


class TitleConflict(StateError, ValueError):
    """Another session already holds this title."""

    def __init__(self, title: str, holder_session_id: str):
        self.title = title
        self.holder_session_id = holder_session_id
        super().__init__(
            f"title {title!r} is already in use by session {holder_session_id}: "
            "choose another title or rename that session first"
        )


class SessionChangedMeanwhile(StateError):
    """The session changed after a split of it was planned (ended, moved, messages gone or added);
    nothing was written."""

    def __init__(self, session_id: str, reason: str, *, new_messages: bool = False):
        self.session_id = session_id
        self.reason = reason
        #: True when the only change is messages stored after the plan was read: plan again with them
        self.new_messages = new_messages
        super().__init__(f"session {session_id} {reason} since the split was planned; nothing was written: "
                         "read it again and plan the split anew")


class DatabaseRefused(StateError):
    """The file cannot be used as the state store; nothing in it was changed."""


class NotADatabase(DatabaseRefused):
    """The file is not a SQLite database, or not a Switchboard state store."""

    def __init__(self, path: str, detail: str = "file is not a SQLite database"):
        self.path = path
        super().__init__(
            f"{path}: {detail}; it was left untouched. Point SWITCHBOARD_HOME (or --home) at another "
            "directory, or move the file away"
        )


class SchemaTooNew(DatabaseRefused):
    """The database was written by a newer Switchboard."""

    def __init__(self, path: str, found: int, supported: int):
        self.path = path
        self.found = found
        self.supported = supported
        super().__init__(
            f"{path}: schema version {found} is newer than this Switchboard understands ({supported}); "
            "it was left untouched. Upgrade Switchboard to use it"
        )


class WriteTimeout(StateError):
    """The write lock stayed busy for longer than the write timeout."""

    def __init__(self, path: str, waited: float):
        self.path = path
        self.waited = waited
        super().__init__(
            f"{path}: another process held the write lock for {waited:.1f}s; nothing was written. "
            "Find the process holding the database (fuser state.db) or raise write_timeout"
        )


class StoreCorrupt(StateError):
    """The SQLite file is damaged; new writes are refused so nothing more is built on it, reads still work."""

    def __init__(self, path: str, problems: list[str] | tuple[str, ...]):
        self.path = path
        self.problems = tuple(problems)
        shown = "; ".join(self.problems[:3]) or "damaged"
        super().__init__(
            f"{path} failed its integrity check ({shown}): new writes are refused, reads still work. "
            "Stop the daemon and run 'switchboard restore BACKUP_FILE' with your newest backup "
            "(its own check runs first)"
        )


class StoreUnavailable(StateError):
    """The PostgreSQL server named by ``store.url`` cannot be reached or refused us."""

    def __init__(self, masked_url: str, reason: str):
        self.url = masked_url
        self.reason = reason
        super().__init__(
            f"cannot use the PostgreSQL store {masked_url}: {reason}. Check store.url (host, port, user, "
            "password, database) and that the server is running and accepts this user"
        )


class MigrationRefused(StateError):
    """Copying a SQLite store into PostgreSQL was refused or failed before copying (the message says why)."""


class ImportFileError(StateError):
    """A line of an import file cannot be restored; nothing from the file was imported."""

    def __init__(self, line_no: int, reason: str):
        self.line_no = line_no
        self.reason = reason
        super().__init__(f"line {line_no}: {reason}; nothing was imported. Fix or remove that line and retry")


class NotAHermesStore(StateError):
    """The file given to ``sessions import --from-hermes`` is not a Hermes Agent ``state.db``."""

    def __init__(self, path: str, detail: str):
        self.path = path
        super().__init__(f"{path} {detail}: it is not a Hermes Agent state.db, and it was left untouched. "
                         "Give the state.db in your Hermes home (~/.hermes/state.db)")


class PairingNotFound(StateError):
    """No pending pairing request has this code."""

    def __init__(self, platform: str, code: str):
        self.platform = platform
        self.code = code
        super().__init__(
            f"no pending {platform} pairing request has code {code!r} (codes expire after an hour): "
            "run 'switchboard pairing list' to see pending codes"
        )


class CronJobNotFound(StateError):
    """No scheduled job has this id."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        super().__init__(f"no scheduled job has the id {job_id!r}: run 'switchboard cron list' to see them")


class CronJobExists(StateError):
    """A scheduled job with this id exists already."""

    def __init__(self, job_id: str, wanted_by: str = "cli"):
        self.job_id = job_id
        if wanted_by == "config":
            msg = (f"cron.jobs has a job {job_id!r}, but a job added with 'switchboard cron add' already has that id: "
                   f"rename one of them (or 'switchboard cron remove {job_id}')")
        else:
            msg = f"a scheduled job {job_id!r} exists already: choose another id or edit that job"
        super().__init__(msg)
