"""One node: its store, its leadership and (when configured) its CDC push service.

``litecdc serve`` builds a Node, serves its HTTP API and closes it on exit.
"""

from __future__ import annotations

import logging

from litecdc.cdc.service import CDCService
from litecdc.config import NodeConfig
from litecdc.leadership import StandaloneLeadership
from litecdc.store import Store

log = logging.getLogger("litecdc.node")


class Node:
    """A standalone node: always the leader, its journal is the log."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.store = Store(config)
        self.leadership = StandaloneLeadership(self.store.journal)
        self.cdc: CDCService | None = None
        try:
            if config.cdc is not None:
                self.cdc = CDCService(
                    config.cdc, self.store, self.leadership, node_id=config.node_id
                )
        except BaseException:
            self.store.close()
            raise

    def start(self) -> None:
        if self.cdc is not None:
            self.cdc.start()

    def close(self) -> None:
        """Stop CDC delivery (persisting its high watermark), then close the store."""
        try:
            if self.cdc is not None:
                self.cdc.stop()
        finally:
            self.store.close()
