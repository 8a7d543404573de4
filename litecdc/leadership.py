"""Leadership as the CDC service sees it, for a standalone node: always the leader.

The cluster implements the same three calls for real (etcd election, entries through
the etcd log); the CDC service depends on nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

from litecdc.journal.journal import Journal


class StandaloneLeadership:
    """A standalone node is always the leader and its journal is the log."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def is_leader(self) -> bool:
        return True

    def add_listener(self, callback: Callable[[bool], None]) -> None:
        callback(True)

    def write_internal(self, query: str) -> int:
        return self._journal.commit_internal(query).cid
