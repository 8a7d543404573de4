"""Webhook sink: POST each batch as one JSON document (at-least-once).

Body of a change batch::

    {"subscription": "orders-hook", "table": "orders", "kind": "changes",
     "after_cid": 40, "end_cid": 42, "part": 1, "parts": 1,
     "events": [{"id": "orders-hook:5d41402abc4b:41-0-upsert", "table": …, "op": …,
                 "cid": …, "seq": …, "key": {…}, "row": {…}}, …]}

(event form: ``litecdc.pipeline.sinks.messages``). A snapshot chunk is
``"kind": "snapshot"`` with its rows as events of op 'snapshot'; the end of a snapshot is
``"kind": "snapshot_done"`` with ``init_cid`` (rows older than it are gone). A batch goes
as several parts when it has more than ``MAX_EVENTS_PER_POST`` events or its body would be
larger than ``MAX_BODY_BYTES`` — receivers commonly refuse more than 1 MiB (nginx's default
``client_max_body_size``) with 413, which no retry gets past; an event larger than that
goes alone.

Ids, the same on every retry and after a restart (receivers de-duplicate on them), scoped
as every message sink's (``messages.scoped_id``: ``<subscription>:<registration>:…``, so
neither another subscription sending here nor a subscription re-created under the name,
whose cids may be the same again, repeats them):

- header ``webhook-id``: ``…:<after_cid>-<end_cid>-<part>`` for changes,
  ``…:<first event's id>-<part>`` for a snapshot chunk, ``…:snapshot-done-<init_cid>``;
- each event's ``id``: ``…:<cid>-<seq>-<op>`` (snapshot rows: ``…:<cid>-snapshot-<hash>``),
  as RabbitMQ's ``message_id`` and NATS's ``Nats-Msg-Id``.

With ``litecdc_secret`` every request carries a Standard Webhooks signature.

Requests: ``litecdc_timeout`` bounds one request whole — connecting, sending, waiting for
and reading the answer. httpx's timeouts bound each network operation only, so a receiver
answering a byte at a time would hold a request for ever; ``litecdc.webhook_client``
(shared with the CDC service's webhook sink) shuts the request's socket down at its
deadline. Credentials in the URL are sent as basic auth and kept out of the URL httpx
handles (and logs); errors and this module's logs show the URL masked (``mask_url``).

Answers: the status decides. 2xx: delivered (the body is not needed: up to
``webhook_client.MAX_ANSWER_BYTES`` of it is read, so that the connection serves the next
request, and a longer or slower one is cut). 408, 429, 5xx and failures of any kind — a refused or
dropped connection, the deadline, an answer that is not HTTP — are retried, with
exponential backoff, up to ``litecdc_retries`` attempts in all. A redirect (3xx) or any
other 4xx is a SinkError at once: redirects are not followed (the batch and its signature
would go to another address); give the sink the address the receiver redirects to.

``applied_cid`` is what this process has delivered (0 after a restart: the pipeline
resumes from its own progress record and the receiver de-duplicates).

Example::

    sink = WebhookSink("https://hooks.example/orders?litecdc_secret=whsec_…", spec, "orders-hook")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.compute as pc

from litecdc.errors import SinkError
from litecdc.pipeline.sinks.base import ChangeBatch, Sink
from litecdc.pipeline.sinks.messages import encode, event_messages, scoped_id, snapshot_messages
from litecdc.pipeline.sinks.registry import (
    WebhookOptions,
    mask_url,
    parse_sink_url,
    scrub_url_password,
)
from litecdc.pipeline.tables import CID_COLUMN, TableSpec
from litecdc.webhook_client import RequestExpired, WebhookClient

log = logging.getLogger("litecdc.pipeline")

USER_AGENT = "litecdc-pipeline/0.1"
MAX_EVENTS_PER_POST = 10_000
#: the largest body of one POST, unless a single event is larger (under nginx's 1 MiB)
MAX_BODY_BYTES = 1_000_000
BACKOFF_BASE = 0.2  # seconds; doubled per attempt
BACKOFF_CAP = 10.0

_Message = tuple[str, dict[str, Any]]  # (unscoped id, event document)


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
        # URL credentials go as basic auth, out of the URL httpx logs (webhook_client)
        self._client = WebhookClient(
            options.url,
            timeout=options.timeout,
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
        )
        self._applied = 0
        self.sleep = time.sleep  # tests may speed the backoff up

    def prepare(self) -> None:
        """Nothing to create; reachability shows at the first POST."""

    # -- one batch ----------------------------------------------------------------------

    def _post(self, body: bytes, batch_id: str) -> None:
        """Deliver one document, retried per the policy (module docstring)."""
        webhook_id = scoped_id(self.subscription, self.registration, batch_id)
        retries = self.options.retries
        last = ""
        for attempt in range(1, retries + 1):
            headers = {"webhook-id": webhook_id}
            if self._key is not None:
                from litecdc.cdc.signing import signature_headers

                headers = signature_headers(self._key, webhook_id, int(time.time()), body)
            try:
                answer = self._client.post(body, headers)
            except Exception as exc:  # every failure of a send is the batch's to retry
                last = self._failure(exc)
            else:
                status = answer.status
                if 300 <= status < 400:
                    raise self._redirect_error(status, answer.location)
                if 200 <= status < 300:
                    return
                if 400 <= status < 500 and status not in (408, 429):
                    size = f" (a body of {len(body)} bytes)" if status == 413 else ""
                    raise SinkError(
                        f"webhook sink: {self._safe} refused the batch with HTTP {status}"
                        f"{size}: check the endpoint's URL and what it accepts"
                    )
                last = f"HTTP {status}"
            if attempt < retries:
                delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
                log.warning(
                    "webhook sink: POST to %s failed (%s), retry %d/%d in %.1fs",
                    self._safe,
                    last,
                    attempt,
                    retries - 1,
                    delay,
                )
                self.sleep(delay)
        raise SinkError(
            f"webhook sink: cannot deliver to {self._safe} after {retries} attempt(s) "
            f"({last}): check the endpoint is up"
        )

    def _failure(self, exc: Exception) -> str:
        """What went wrong in one attempt, in a few words, without the URL's password."""
        if isinstance(exc, RequestExpired):
            return (
                f"timed out: no complete answer within litecdc_timeout ({self.options.timeout:g}s)"
            )
        if isinstance(exc, httpx.TimeoutException):
            return (
                f"timed out: {type(exc).__name__} after litecdc_timeout ({self.options.timeout:g}s)"
            )
        detail = scrub_url_password(str(exc), self.options.url)
        return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__

    def _redirect_error(self, status: int, location: str | None) -> SinkError:
        target = f" to {mask_url(location)}" if location else ""
        return SinkError(
            f"webhook sink: {self._safe} answered HTTP {status}, a redirect{target}: "
            "redirects are not followed (the batch and its signature would go to another "
            "address): give the sink the URL the endpoint redirects to"
        )

    # -- documents ----------------------------------------------------------------------

    def _send(self, kind: str, messages: Sequence[_Message], batch_id: str, **fields: Any) -> None:
        """POST ``messages`` as one document of ``kind``, or as several parts."""
        events = [
            encode({"id": scoped_id(self.subscription, self.registration, i), **doc})
            for i, doc in messages
        ]

        def head(part: int, parts: int) -> bytes:
            doc = {
                "subscription": self.subscription,
                "table": self.spec.name,
                "kind": kind,
                **fields,
                "part": part,
                "parts": parts,
            }
            return encode(doc)[:-1] + b',"events":['  # "events" goes last

        room = MAX_BODY_BYTES - len(head(10**9, 10**9)) - len(b"]}")
        groups = _groups(events, room)
        for number, group in enumerate(groups, start=1):
            body = head(number, len(groups)) + b",".join(group) + b"]}"
            self._post(body, f"{batch_id}-{number}")

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        messages = list(snapshot_messages(rows, self.spec))
        cid = pc.max(rows[CID_COLUMN]).as_py()
        # the first row's id names the chunk: stable across retries and processes
        self._send("snapshot", messages, messages[0][0], cid=cid)

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        if batch.end_cid <= self._applied:
            return False
        if self._applied and events.num_rows:
            events = events.filter(pc.greater(events[CID_COLUMN], self._applied))
        after = max(batch.after_cid, self._applied)
        self._send(
            "changes",
            list(event_messages(events, self.spec)),
            f"{after}-{batch.end_cid}",
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
        self._post(encode(doc), f"snapshot-done-{init_cid}")
        return 0

    def applied_cid(self) -> int:
        return self._applied

    def close(self) -> None:
        self._client.close()


def _groups(events: list[bytes], room: int) -> list[list[bytes]]:
    """``events`` in order, in groups of at most MAX_EVENTS_PER_POST events and ``room``
    bytes (with the commas between them) — an event larger than ``room`` alone. One
    empty group for no events (the batch's document still goes)."""
    groups: list[list[bytes]] = [[]]
    size = 0
    for event in events:
        group = groups[-1]
        if group and (len(group) >= MAX_EVENTS_PER_POST or size + 1 + len(event) > room):
            group = []
            groups.append(group)
            size = 0
        size += len(event) + (1 if len(group) else 0)
        group.append(event)
    return groups
