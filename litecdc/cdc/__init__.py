"""The CDC push service: captured row changes delivered to a webhook (DESIGN.md §3)."""

from litecdc.cdc.config import CDCConfig, TLSConfig, parse_cdc_config
from litecdc.cdc.service import CDCService, ChangeFeed, Leadership
from litecdc.cdc.sinks import Sink, TransmitError, known_schemes, register_sink

__all__ = [
    "CDCConfig",
    "CDCService",
    "ChangeFeed",
    "Leadership",
    "Sink",
    "TLSConfig",
    "TransmitError",
    "known_schemes",
    "parse_cdc_config",
    "register_sink",
]
