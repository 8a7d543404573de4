"""litecdc's HTTP API: rqlite-compatible endpoints plus the journal and change log.

``create_app(store, config)`` builds the Starlette app; ``serve(config)`` opens the store
and runs it under uvicorn (HTTP or HTTPS). See docs/http-api.md.
"""

from __future__ import annotations

from litecdc.http.app import create_app
from litecdc.http.server import serve

__all__ = ["create_app", "serve"]
