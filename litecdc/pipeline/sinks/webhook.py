"""Webhook sink: POST each batch as one JSON document (at-least-once).

Body of a change batch::

    {"subscription": "orders-hook", "table": "orders", "kind": "changes",
     "after_cid": 40, "end_cid": 42, "part": 1, "parts": 1,
     "events": [{"id": "41-0-upsert", "table": …, "op": …, "cid": …, "seq": …,
                 "key": {…}, "row": {…}}, …]}

(event form: ``litecdc.pipeline.sinks.messages``). A snapshot chunk is
``"kind": "snapshot"`` with its rows as events of op 'snapshot'; the end of a snapshot is
``"kind": "snapshot_done"`` with ``init_cid`` (rows older than it are gone). A batch of
more than ``MAX_EVENTS_PER_POST`` events goes as several parts. Every request carries
``webhook-id`` (stable across retries: receivers de-duplicate on it) and, with
``litecdc_secret``, a Standard Webhooks signature.

Retries: connection errors, timeouts, 429 and 5xx are retried ``litecdc_retries`` times
with exponential backoff; any other 4xx is a SinkError at once (the request is wrong).
``applied_cid`` is what this process has delivered (0 after a restart: the pipeline
resumes from its own progress record and the receiver de-duplicates).

Example::

    sink = WebhookSink("https://hooks.example/orders?litecdc_secret=whsec_…", spec, "orders-hook")
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.compute as pc

from litecdc.errors import SinkError
from litecdc.pipeline.sinks.base import ChangeBatch, Sink
from litecdc.pipeline.sinks.messages import event_messages, snapshot_messages
from litecdc.pipeline.sinks.registry import WebhookOptions, mask_url, parse_sink_url
from litecdc.pipeline.tables import CID_COLUMN, TableSpec

log = logging.getLogger("litecdc.pipeline")

USER_AGENT = "litecdc-pipeline/0.1"
MAX_EVENTS_PER_POST = 10_000
BACKOFF_BASE = 0.2  # seconds; doubled per attempt
BACKOFF_CAP = 10.0


class WebhookSink(Sink):
    kind = "log"

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, WebhookOptions):
            raise SinkError(f"webhook sink: {mask_url(url)} is not an http(s):// URL")
        self.options = options
        self._safe = mask_url(options.url)
        self._key: bytes | None = None
        if options.secret:
            from litecdc.cdc.signing import decode_secret

            self._key = decode_secret(options.secret)
        self._client = httpx.Client(
            timeout=options.timeout,
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
            follow_redirects=False,
        )
        self._applied = 0
        self.sleep = time.sleep  # tests may speed the backoff up

    def prepare(self) -> None:
        """Nothing to create; reachability shows at the first POST."""

    def _post(self, doc: dict[str, Any], message_id: str) -> None:
        body = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        data = body.encode()
        last = ""
        for attempt in range(1, self.options.retries + 1):
            headers = {"webhook-id": message_id}
            if self._key is not None:
                from litecdc.cdc.signing import signature_headers

                headers = signature_headers(self._key, message_id, int(time.time()), data)
            try:
                response = self._client.post(self.options.url, content=data, headers=headers)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return
                if 400 <= status < 500 and status not in (408, 429):
                    raise SinkError(
                        f"webhook sink: {self._safe} refused the batch with HTTP {status}: "
                        "check the endpoint's URL and what it accepts"
                    )
                last = f"HTTP {status}"
            if attempt < self.options.retries:
                delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
                log.warning(
                    "webhook sink: POST to %s failed (%s), retry %d/%d in %.1fs",
                    self._safe,
                    last,
                    attempt,
                    self.options.retries - 1,
                    delay,
                )
                self.sleep(delay)
        raise SinkError(
            f"webhook sink: cannot deliver to {self._safe} after {self.options.retries} "
            f"attempts ({last}): check the endpoint is up"
        )

    def _send(self, kind: str, events: list[dict[str, Any]], base_id: str, **fields: Any) -> None:
        parts = max(1, -(-len(events) // MAX_EVENTS_PER_POST))
        for part in range(parts):
            chunk = events[part * MAX_EVENTS_PER_POST : (part + 1) * MAX_EVENTS_PER_POST]
            doc = {
                "subscription": self.subscription,
                "table": self.spec.name,
                "kind": kind,
                **fields,
                "part": part + 1,
                "parts": parts,
                "events": chunk,
            }
            self._post(doc, f"{base_id}-{part + 1}")

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        events = [{"id": i, **doc} for i, doc in snapshot_messages(rows, self.spec)]
        cid = pc.max(rows[CID_COLUMN]).as_py()
        # the first row's id names the chunk: stable across retries and processes
        self._send("snapshot", events, f"{self.subscription}-{events[0]['id']}", cid=cid)

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        if batch.end_cid <= self._applied:
            return False
        if self._applied and events.num_rows:
            events = events.filter(pc.greater(events[CID_COLUMN], self._applied))
        docs = [{"id": i, **doc} for i, doc in event_messages(events, self.spec)]
        after = max(batch.after_cid, self._applied)
        self._send(
            "changes",
            docs,
            f"{self.subscription}-{after}-{batch.end_cid}",
            after_cid=after,
            end_cid=batch.end_cid,
        )
        self._applied = batch.end_cid
        return True

    def finish_snapshot(self, init_cid: int) -> int:
        doc = {
            "subscription": self.subscription,
            "table": self.spec.name,
            "kind": "snapshot_done",
            "init_cid": init_cid,
        }
        self._post(doc, f"{self.subscription}-snapshot-done-{init_cid}")
        return 0

    def applied_cid(self) -> int:
        return self._applied

    def close(self) -> None:
        self._client.close()
