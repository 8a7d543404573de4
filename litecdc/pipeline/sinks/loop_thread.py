"""An asyncio event loop in a private daemon thread, for sinks whose client is asyncio.

The NATS sink (nats-py) and the RabbitMQ sink (pika's asyncio adapter) keep many
publishes in flight and wait for their acknowledgements on such a loop, while their
``Sink`` methods stay synchronous: each hands a coroutine to the loop and waits for its
result. Every client object lives on the loop's thread and is touched only there.

Example::

    loop = LoopThread("litecdc-nats-sink")
    value = loop.run(some_coroutine(), timeout=10)
    loop.stop()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread named ``name``; ``run`` waits for a coroutine's
    result in the calling thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """The coroutine's result (or its exception); ``TimeoutError`` after ``timeout``
        seconds (None: no limit — the coroutine must bound its own waits)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()
