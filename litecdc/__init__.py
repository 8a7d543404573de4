"""litecdc: a replicated SQLite database with change data capture."""

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
