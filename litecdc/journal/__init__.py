"""The hctree-style journal: modes, leader and follower commit, truncation."""

from litecdc.journal.journal import Journal, Mode

__all__ = ["Journal", "Mode"]
