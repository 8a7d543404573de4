"""litecdc: a replicated SQLite database with change data capture.

The public names load on first use, so a process that needs one part (a Spark worker
running the pipeline's data source) does not import the node's storage engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from litecdc.config import NodeConfig
    from litecdc.errors import LitecdcError
    from litecdc.journal import Journal, Mode
    from litecdc.results import (
        JournalEntry,
        LogEntry,
        RowChange,
        Statement,
        StatementResult,
        WriteOutcome,
    )
    from litecdc.store import Store

_EXPORTS = {
    "Journal": "litecdc.journal",
    "JournalEntry": "litecdc.results",
    "LitecdcError": "litecdc.errors",
    "LogEntry": "litecdc.results",
    "Mode": "litecdc.journal",
    "NodeConfig": "litecdc.config",
    "RowChange": "litecdc.results",
    "Statement": "litecdc.results",
    "StatementResult": "litecdc.results",
    "Store": "litecdc.store",
    "WriteOutcome": "litecdc.results",
}

__all__ = [
    "Journal",
    "JournalEntry",
    "LitecdcError",
    "LogEntry",
    "Mode",
    "NodeConfig",
    "RowChange",
    "Statement",
    "StatementResult",
    "Store",
    "WriteOutcome",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'litecdc' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
