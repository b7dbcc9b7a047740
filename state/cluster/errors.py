"""What the cluster primitives raise on purpose.

    StateError                      (state.errors) root of everything the store raises on purpose
    └── ClusterError                a cluster primitive refused or could not do something
        ├── OwnershipLost           this instance no longer owns a platform connection (.key, .reason):
        │                           stop that connection now, then wait as a standby again
        ├── LeaseLost               a session's lease is no longer ours (.session_id, .token,
        │                           .current_token, .holder); nothing was written
        └── NotInTransaction        a fenced write was attempted outside the transaction it guards

Every message says what to do next.
"""

from __future__ import annotations

from ..errors import StateError


class ClusterError(StateError):
    """A cluster primitive refused or could not do something."""


class OwnershipLost(ClusterError):
    """This instance no longer owns the platform connection: stop it before doing anything else."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(
            f"this instance no longer owns {key!r} ({reason}): stop that platform connection now; "
            "another instance may own it already. Wait as a standby (acquire() again)"
        )


class LeaseLost(ClusterError):
    """The lease on a session is no longer ours; the transaction it guarded must write nothing."""

    def __init__(self, session_id: str, token: int, *, current_token: int | None, holder: str | None,
                 reason: str):
        self.session_id = session_id
        self.token = token
        self.current_token = current_token
        self.holder = holder
        self.reason = reason
        super().__init__(
            f"the lease on session {session_id} with fencing token {token} is no longer ours ({reason}); "
            "nothing was written. Drop this turn without sending anything: the instance holding the "
            "current lease answers it"
        )


class NotInTransaction(ClusterError):
    """A fenced write was attempted where its lock would not last until the writes commit."""

    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(
            f"fenced_write for session {session_id} ran outside a transaction, so the lease row lock "
            "would not cover the turn's writes: call it first inside the transaction that writes them "
            "(`with conn.transaction():` on an autocommit connection)"
        )
