"""When a read must stop before it is done: rqlite's ``db_timeout``, or its client left.

SQLite's progress handler asks :meth:`ReadLimit.stop_now` every
:data:`READ_CHECK_STEPS` virtual-machine instructions of a read; a True answer interrupts
the statement (``apsw.InterruptError``), and the statement's result says why
(:meth:`ReadLimit.reason`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: VM instructions between two checks: one Python call per some tens of microseconds of
#: SQLite work, so a limit costs a read next to nothing and stops it within milliseconds
READ_CHECK_STEPS = 10_000
#: a read that ran past its db_timeout (rqlite's ErrQueryTimeout text)
QUERY_TIMEOUT = "query timeout"
#: a read whose client went away before it finished: nobody reads its rows
CLIENT_LEFT = "query cancelled: its client disconnected"


class ReadLimit:
    """A read's deadline (``timeout`` seconds from now; None: none) and whether it was
    cancelled. Thread-safe enough for its use: :meth:`cancel` sets one flag that the
    reading thread only reads."""

    __slots__ = ("_cancelled", "_client_gone", "deadline")

    def __init__(
        self, timeout: float | None = None, client_gone: Callable[[], bool] | None = None
    ) -> None:
        #: time.monotonic() past which the read stops (None: no deadline)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._cancelled = False
        #: asked at each check: whether the read's client has disconnected
        self._client_gone = client_gone

    def cancel(self) -> None:
        """Stop the read at its next check (its client left)."""
        self._cancelled = True

    def stop_now(self) -> bool:
        """SQLite's progress handler: True interrupts the running statement."""
        if self._cancelled:
            return True
        if self._client_gone is not None and self._client_gone():
            self._cancelled = True
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def reason(self) -> str | None:
        """Why the read must stop (a statement's error), or None while it may go on."""
        if self._cancelled or (self._client_gone is not None and self._client_gone()):
            return CLIENT_LEFT
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return QUERY_TIMEOUT
        return None
