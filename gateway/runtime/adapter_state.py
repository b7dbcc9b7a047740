"""An adapter's state between runs (``gateway.types.AdapterState``), kept in the store.

    adapter.keep_state_in(StoredAdapterState(db, "matrix", home))

The values go into ``db.prefs`` under the key ``adapter:<platform>`` (no schema step: a chat's
preferences and an adapter's values are both short named text), so every instance of a cluster
reads the same ones and a takeover resumes where the last owner stopped.  ``directory`` is
``<home>/platforms/<platform>``, which the adapter creates private to the daemon's user (0700) when it
first writes there, for what must stay on one machine (Matrix: the device's access token when it logged in with a password).
"""

from __future__ import annotations

import time
from pathlib import Path

from state.aio import AsyncSessionDB


class StoredAdapterState:
    def __init__(self, db: AsyncSessionDB, platform: str, home: Path, *, clock=time.time):
        self._db = db
        self._key = f"adapter:{platform}"
        self.directory = Path(home) / "platforms" / platform
        self._clock = clock

    async def get(self, name: str) -> str | None:
        return await self._db.prefs.get(self._key, name)

    async def set(self, name: str, value: str) -> None:
        await self._db.prefs.set(self._key, name, value, now=self._clock())
