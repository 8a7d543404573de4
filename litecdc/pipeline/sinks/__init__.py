"""Pipeline sinks: one module per destination, all behind ``base.Sink``."""

from __future__ import annotations

from litecdc.pipeline.sinks.base import ChangeBatch, Sink, message_id

__all__ = ["ChangeBatch", "Sink", "message_id"]
