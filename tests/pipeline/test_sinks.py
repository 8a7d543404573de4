"""The shared behaviour suite of the pipeline sinks, run against real servers/formats.

Mirror sinks (Delta, PostgreSQL, MariaDB) must end up holding exactly the source's rows
whatever the interleaving of snapshot chunks and change batches, replays and retries.
Log sinks (NATS JetStream, RabbitMQ, webhook) are read back with their own clients.
Servers come from the session fixtures of tests/servers (a missing one fails, never skips).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import nats
import pika  # type: ignore[import-untyped]
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pymysql
import pytest
from deltalake import DeltaTable, write_deltalake
from fakes.certs import make_certs, server_ssl_context
from fakes.tcp_proxy import TcpProxy
from fakes.webhook_receiver import WebhookReceiver, verify_standard_webhook
from sink_contract import (
    COMPOSITE_SPEC,
    SPEC,
    Message,
    SourceSim,
    canonical_rows,
    incompressible,
    nats_raw_messages,
    rabbitmq_messages,
    sample_row,
    table_rows,
)

from litecdc.errors import SchemaMismatchError, SinkError, SinkUnreachableError
from litecdc.localservers import RabbitMQServer
from litecdc.pipeline.sinks import rabbitmq
from litecdc.pipeline.sinks.base import ChangeBatch, Sink, UnstorableKeyError, message_id
from litecdc.pipeline.sinks.messages import snapshot_message_id
from litecdc.pipeline.sinks.nats import STATE_BUCKET, NatsSink
from litecdc.pipeline.sinks.registry import (
    DeltaOptions,
    SqlOptions,
    WebhookOptions,
    mask_url,
    open_sink,
    parse_sink_url,
    scrub_password,
)
from litecdc.pipeline.sinks.webhook import WebhookSink
from litecdc.pipeline.tables import (
    CID_COLUMN,
    OP_COLUMN,
    SEQ_COLUMN,
    Column,
    TableSpec,
)

MIRRORS = ["delta", "postgresql", "mariadb"]


@dataclass(frozen=True)
class Mirror:
    kind: str
    url_for: Callable[[str], str]  # a fresh mirror table's URL, by table name

    def url(self) -> str:
        return self.url_for(fresh_name())

    def normalise(self, value: object) -> object:
        # MariaDB's DOUBLE stores -0.0 as 0.0 (a documented limitation of that sink)
        if self.kind == "mariadb" and isinstance(value, float) and value == 0.0:
            return 0.0
        return value


def fresh_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=MIRRORS)
def mirror(request: pytest.FixtureRequest, tmp_path: Path) -> Mirror:
    """Fresh mirror tables of this parameter's sink."""
    kind = request.param
    if kind == "delta":
        return Mirror(kind, lambda name: f"delta:{tmp_path}/{name}")
    base = request.getfixturevalue(f"{kind}_url")
    return Mirror(kind, lambda name: f"{base}?table={name}")


@pytest.fixture
def opened() -> Iterator[list[Sink]]:
    sinks: list[Sink] = []
    yield sinks
    for sink in sinks:
        sink.close()


def open_tracked(opened: list[Sink], url: str, spec: TableSpec, sub: str = "sub") -> Sink:
    sink = open_sink(url, spec, sub)
    opened.append(sink)
    return sink


def test_reading_a_mirror_not_made_yet_says_so_and_makes_nothing(
    mirror: Mirror, opened: list[Sink]
) -> None:
    """What `pipeline verify` says before `run` copied the subscription (retest QA:
    PostgreSQL's and MariaDB's own words, 'relation … does not exist'); nothing is made."""
    url = mirror.url()
    sink = open_sink(url, SPEC, "sub", prepare=False)
    opened.append(sink)
    with pytest.raises(SinkError, match=r"there is no (Delta )?table .* yet: has `litecdc"):
        sink.read_rows()
    assert sink.applied_cid() == 0
    with pytest.raises(SinkError, match="there is no"):
        sink.read_rows()  # still not made


def assert_mirror(sink: Sink, src: SourceSim, mirror: Mirror) -> None:
    got = canonical_rows(table_rows(sink.read_rows()))
    want = canonical_rows(
        {k: mirror.normalise(v) for k, v in row.items()} for row in src.expected_rows()
    )
    assert got == want


def batch(src: SourceSim, after: int, end: int, sub: str = "sub") -> tuple[pa.Table, ChangeBatch]:
    return src.events(after, end), ChangeBatch(sub, after, end)


# -- mirrors ----------------------------------------------------------------------------


def test_mirror_converges_across_chunks_batches_replays_and_retries(
    mirror: Mirror, opened: list[Sink]
) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 31)])
    init = src.cid  # registration: the log is read from here
    src.commit(("upsert", {**sample_row(2), "name": "updated before chunk a"}))
    src.commit(("delete", (3,)))
    chunk_a = src.chunk(0, 15, src.cid)  # read at init + 2
    src.commit(("upsert", {**sample_row(20), "price": 2.5}), ("upsert", sample_row(40)))
    src.commit(("rekey", ((21,), {**sample_row(21), "id": 41})))
    src.commit(("delete", (22,)), ("upsert", {**sample_row(4), "n": 2**62}))
    chunk_b = src.chunk(15, 100, src.cid)  # read at init + 5
    src.commit(("upsert", {**sample_row(5), "data": b"\x00new"}), ("delete", (23,)))
    src.commit(("delete", (41,)))  # the re-keyed row goes again
    src.commit(("upsert", sample_row(22)))  # a deleted key comes back
    mid = init + 4
    end = src.cid

    sink = open_tracked(opened, mirror.url(), SPEC)
    assert sink.applied_cid() == 0
    sink.write_snapshot(chunk_a)
    sink.write_snapshot(chunk_b)
    sink.write_snapshot(chunk_a)  # a chunk retried after a crash
    assert sink.finish_snapshot(init) == 0  # every chunk was read at or after init
    assert sink.write_changes(*batch(src, init, mid)) is True
    assert sink.applied_cid() == mid
    assert sink.write_changes(*batch(src, mid, end)) is True
    assert sink.applied_cid() == end
    assert_mirror(sink, src, mirror)

    # an older batch replayed after a newer one changes nothing: deleted rows stay deleted
    assert sink.write_changes(*batch(src, init, mid)) is False
    # the newest batch retried
    assert sink.write_changes(*batch(src, mid, end)) is False
    assert sink.applied_cid() == end
    assert_mirror(sink, src, mirror)

    # a batch overlapping what was applied: the applied part is dropped, the rest applied
    src.commit(("upsert", {**sample_row(6), "name": "after"}), ("delete", (7,)))
    src.commit(("upsert", sample_row(50)))
    assert sink.write_changes(*batch(src, end - 2, src.cid)) is True
    assert sink.applied_cid() == src.cid
    assert_mirror(sink, src, mirror)


def test_mirror_empty_batch_is_recorded(mirror: Mirror, opened: list[Sink]) -> None:
    src = SourceSim(SPEC)
    sink = open_tracked(opened, mirror.url(), SPEC)
    assert sink.write_changes(src.events(0, 0), ChangeBatch("sub", 0, 17)) is True
    assert sink.applied_cid() == 17
    assert sink.write_changes(src.events(0, 0), ChangeBatch("sub", 0, 17)) is False
    assert sink.read_rows().num_rows == 0


def test_mirror_values_round_trip_exactly(mirror: Mirror, opened: list[Sink]) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 64)])
    sink = open_tracked(opened, mirror.url(), SPEC)
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    assert_mirror(sink, src, mirror)
    # as `pipeline verify` reads a mirror: in parts (whole, it took GBs — scale QA)
    parts = list(sink.read_row_batches(10))
    assert len(parts) >= 7 and all(0 < part.num_rows <= 10 for part in parts)
    assert canonical_rows(table_rows(pa.concat_tables(parts))) == canonical_rows(
        table_rows(sink.read_rows())
    )
    # updates to NULL and back
    src.commit(
        ("upsert", {"id": 1, "name": None, "price": None, "data": None, "n": None}),
        ("upsert", {**sample_row(2), "price": float("-0.0")}),
    )
    assert sink.write_changes(*batch(src, 1, src.cid)) is True
    assert_mirror(sink, src, mirror)


def test_mirror_composite_text_key(mirror: Mirror, opened: list[Sink]) -> None:
    src = SourceSim(COMPOSITE_SPEC)
    keys = ["", "a", "A", "a ", "é", "😀", "long " + "x" * 200]
    src.commit(*[("upsert", {"region": r, "n": i, "value": f"v{i}"}) for i, r in enumerate(keys)])
    init = src.cid
    src.commit(("delete", ("a", 1)), ("upsert", {"region": "A", "n": 2, "value": "changed"}))
    src.commit(("rekey", (("é", 4), {"region": "e", "n": 4, "value": "rekeyed"})))
    sink = open_tracked(opened, mirror.url(), COMPOSITE_SPEC)
    sink.write_snapshot(src.chunk("", "\U0010ffff", init))
    assert sink.write_changes(*batch(src, init, src.cid)) is True
    assert_mirror(sink, src, mirror)


def test_finish_snapshot_sweeps_rows_a_resnapshot_did_not_see(
    mirror: Mirror, opened: list[Sink]
) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 21)])
    sink = open_tracked(opened, mirror.url(), SPEC)
    sink.write_snapshot(src.chunk(0, 100, src.cid))
    sink.finish_snapshot(src.cid)
    # the subscription fell behind the retention cap: rows vanished meanwhile
    src.commit(("delete", (3,)), ("delete", (4,)), ("upsert", sample_row(30)))
    src.commit(("delete", (11,)))
    init = src.cid  # the re-snapshot's registration
    src.commit(("upsert", {**sample_row(12), "name": "late"}))
    sink.write_snapshot(src.chunk(0, 10, src.cid))
    sink.write_snapshot(src.chunk(10, 100, src.cid))
    assert sink.finish_snapshot(init) == 3  # ids 3, 4 and 11
    assert sink.write_changes(*batch(src, init, src.cid)) is True
    assert_mirror(sink, src, mirror)


def test_mirror_schema_evolution_adds_the_column(mirror: Mirror, opened: list[Sink]) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 6)])
    url = mirror.url()
    sink = open_tracked(opened, url, SPEC)
    assert sink.write_changes(*batch(src, 0, 1)) is True

    wider = replace(SPEC, columns=(*SPEC.columns, Column("note", "TEXT", "string")))
    sink.evolve(wider)
    src2 = SourceSim(wider, cid=src.cid, rows={k: {**r, "note": None} for k, r in src.rows.items()})
    src2.states[src.cid] = dict(src2.rows)
    src2.commit(("upsert", {**sample_row(2), "note": "new column"}), ("upsert", sample_row(9)))
    assert sink.write_changes(*batch(src2, 1, src2.cid)) is True
    assert_mirror(sink, src2, mirror)
    # a sink opened later with the wider description finds the column there
    again = open_tracked(opened, url, wider)
    assert again.applied_cid() == src2.cid
    assert_mirror(again, src2, mirror)


def test_mirror_reopened_keeps_rows_and_applied_cid(mirror: Mirror, opened: list[Sink]) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 11)])
    src.commit(("delete", (5,)))
    url = mirror.url()
    first = open_sink(url, SPEC, "sub")
    assert first.write_changes(*batch(src, 0, src.cid)) is True
    first.close()
    second = open_tracked(opened, url, SPEC)
    assert second.applied_cid() == src.cid
    assert second.write_changes(*batch(src, 0, src.cid)) is False
    assert_mirror(second, src, mirror)
    # another subscription into another table of the same place has its own record
    other = open_tracked(opened, mirror.url(), SPEC, sub="other")
    assert other.applied_cid() == 0


def test_mirror_of_a_subscription_recreated_under_its_name_keeps_no_old_record(
    mirror: Mirror, opened: list[Sink]
) -> None:
    """The record of the last batch an earlier subscription of the name applied (its
    mirror kept) made the new one skip its own batches up to that cid — all of them when
    it reads another source, whose cids are lower. The server calls forget_progress and
    sets a new registration when a subscription registers."""
    earlier = SourceSim(SPEC)
    for i in range(1, 9):
        earlier.commit(("upsert", sample_row(i)))
    url = mirror.url()
    first = open_sink(url, SPEC, "sub")
    first.registration = "first"
    assert first.write_changes(*batch(earlier, 0, earlier.cid)) is True
    first.close()
    other_source = SourceSim(SPEC)
    other_source.commit(("upsert", sample_row(100)))
    assert other_source.cid < earlier.cid
    second = open_tracked(opened, url, SPEC)
    second.registration = "second"
    second.forget_progress()
    assert second.applied_cid() == 0
    assert second.write_changes(*batch(other_source, 0, other_source.cid)) is True
    ids = {row["id"] for row in table_rows(second.read_rows())}
    assert 100 in ids


def test_a_kept_mirror_becomes_the_copy_of_another_source(
    mirror: Mirror, opened: list[Sink]
) -> None:
    """Sinks QA: a subscription re-created under its name on another source, its mirror
    kept, left the mirror stale, silently — the old rows' cids were above every cid of
    the new source, so the version guard kept them against the snapshot's rows and the
    sweep kept them too. The server has the sink disown those rows (cid 0) when the new
    subscription registers, before it writes anything."""
    earlier = SourceSim(SPEC)
    for i in range(1, 40):
        earlier.commit(("upsert", sample_row(i % 5 + 1)))  # ids 1-5, cids up to 39
    url = mirror.url()
    old = open_sink(url, SPEC, "sub")
    old.write_snapshot(earlier.chunk(0, 100, earlier.cid))
    old.finish_snapshot(earlier.cid)
    old.close()

    other = SourceSim(SPEC)  # another node: its cids start again at 1
    other.commit(("upsert", {**sample_row(1), "name": "the other source's"}))
    other.commit(("upsert", sample_row(7)))
    init = other.cid
    other.commit(("upsert", {**sample_row(7), "price": 9.5}))
    sink = open_tracked(opened, url, SPEC)
    sink.forget_progress()
    assert sink.disown_rows(init) == 5  # every kept row is at or above cid 2
    assert sink.disown_rows(init) == 0  # (again, after a crash: nothing left to take)
    sink.write_snapshot(other.chunk(0, 100, init))
    assert sink.finish_snapshot(init) == 4  # ids 2-5, which this source has not
    assert sink.write_changes(*batch(other, init, other.cid)) is True
    assert_mirror(sink, other, mirror)


def test_mirror_refuses_a_column_of_another_type(mirror: Mirror, opened: list[Sink]) -> None:
    url = mirror.url()
    open_tracked(opened, url, SPEC)
    clashing = replace(
        SPEC,
        columns=tuple(
            Column(c.name, "TEXT", "string") if c.name == "n" else c for c in SPEC.columns
        ),
    )
    with pytest.raises(SchemaMismatchError, match="'n'"):
        open_sink(url, clashing, "sub")


#: names a mirror must take as they are: SQL quotes, '%' and what drivers read as their
#: placeholders ('%s', '%(x)s', '?'), spaces, '#', '.', backticks, non-ASCII letters
ODD_TABLE = 'we ird?t#b"x.%s ✓ `q` %'
ODD_SPEC = TableSpec(
    ODD_TABLE,
    (
        Column("i d%s", "INTEGER", "int64", not_null=True),
        Column('naïve "✓" %', "TEXT", "string"),
        Column("%(x)s", "REAL", "float64"),
        Column("b`%'", "BLOB", "binary"),
    ),
    ("i d%s",),
)


def odd_row(i: int, text: str = "t") -> dict[str, object]:
    return {"i d%s": i, 'naïve "✓" %': f"{text} {i} %s", "%(x)s": i / 3, "b`%'": bytes([i])}


def test_mirror_takes_table_and_column_names_with_quotes_percent_and_spaces(
    mirror: Mirror, opened: list[Sink]
) -> None:
    """QA: a PostgreSQL table named 'we ird?t#b"x.%' had its snapshot written, then every
    sweep failed ("only '%s', '%b', '%t' are allowed as placeholders, got '%\"'"):
    psycopg does not double a '%' inside an Identifier when parameters are passed."""
    # a Delta path holds no '%' (delta-rs reads %XX in it: the URL is refused)
    place = ODD_TABLE.replace("%", "") if mirror.kind == "delta" else ODD_TABLE
    url = mirror.url_for(quote(place, safe=""))
    if mirror.kind == "postgresql":
        url += "&schema=" + quote('sch%s "é" %', safe="")
    src = SourceSim(ODD_SPEC)
    src.commit(*[("upsert", odd_row(i)) for i in range(1, 6)])
    init = src.cid
    src.commit(("upsert", odd_row(2, "changed")), ("delete", (3,)))
    src.commit(("upsert", odd_row(9)))

    sink = open_tracked(opened, url, ODD_SPEC)
    sink.write_snapshot(src.chunk(0, 100, init))
    assert sink.finish_snapshot(init) == 0
    assert sink.write_changes(*batch(src, init, src.cid)) is True
    assert sink.applied_cid() == src.cid
    assert_mirror(sink, src, mirror)
    # opened again: the existing table is checked (columns, key) and taken
    again = open_tracked(opened, url, ODD_SPEC)
    assert again.applied_cid() == src.cid
    assert again.write_changes(*batch(src, init, src.cid)) is False
    src.commit(("delete", (1,)))
    assert again.write_changes(*batch(src, src.cid - 1, src.cid)) is True
    assert_mirror(again, src, mirror)


def test_postgresql_sinks_prepared_at_once_all_create_their_tables(
    postgresql_url: str, opened: list[Sink]
) -> None:
    """QA: `pipeline run` prepares its subscriptions' sinks on parallel threads; into a new
    schema, CREATE … IF NOT EXISTS of the shared state table from several connections at
    once failed all but one (duplicate key … pg_type), each retried."""
    schema = fresh_name()
    start = threading.Barrier(6)
    errors: list[BaseException] = []

    def prepare(k: int) -> None:
        start.wait()
        try:
            open_tracked(opened, f"{postgresql_url}?table=t{k}&schema={schema}", SPEC, f"s{k}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=prepare, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(opened) == 6


def test_a_postgresql_server_gone_while_verify_reads_says_so(
    postgresql_url: str, opened: list[Sink]
) -> None:
    """Scale QA: a server stopped while verify read the mirror answered only psycopg's
    "received 2 results from command 'FETCH FORWARD …'"."""
    table = fresh_name()
    sink = open_tracked(opened, f"{postgresql_url}?table={table}", SPEC, sub="gone")
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 21)])
    assert sink.write_changes(*batch(src, 0, src.cid, sub="gone")) is True
    parts = sink.read_row_batches(5)
    assert next(parts).num_rows == 5
    with psycopg.connect(postgresql_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'litecdc-gone'"
        )
    with pytest.raises(SinkUnreachableError, match=r"the server of .* went away while verify"):
        list(parts)


def test_postgresql_sink_creates_a_missing_schema(postgresql_url: str, opened: list[Sink]) -> None:
    """A ?schema= that did not exist was accepted by subscribe and failed every run."""
    schema, table = fresh_name(), fresh_name()
    sink = open_tracked(opened, f"{postgresql_url}?table={table}&schema={schema}", SPEC)
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 8)])
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    assert_mirror(sink, src, Mirror("postgresql", lambda name: name))
    with psycopg.connect(postgresql_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "ORDER BY table_name",
            (schema,),
        ).fetchall()
    assert tables == [("litecdc_sink_state",), (table,)]


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_an_sql_mirror_with_a_required_column_of_its_own_is_refused_before_writing(
    kind: str, request: pytest.FixtureRequest, opened: list[Sink]
) -> None:
    """Sinks QA: an existing mirror table with an extra NOT NULL column without a default
    passed the up-front check; the first snapshot write then failed with the database's
    words (PostgreSQL's naming the row's values in the log). Columns with a default, or
    that take NULL, or are generated, are fine: a row leaves them out."""
    base = request.getfixturevalue(f"{kind}_url")
    refused, fine = fresh_name(), fresh_name()
    ident = '"{}"' if kind == "postgresql" else "`{}`"
    harmless = (
        "kept text NOT NULL DEFAULT 'x', maybe text, "
        "counted bigint GENERATED ALWAYS AS (id * 2) STORED"
    )
    statements = [
        f"CREATE TABLE {ident.format(table)} (id bigint PRIMARY KEY, name text, price double "
        f"precision, data {'bytea' if kind == 'postgresql' else 'longblob'}, n bigint, "
        f"_litecdc_cid bigint NOT NULL, {extra}{harmless})"
        for table, extra in ((refused, "extra bigint NOT NULL, "), (fine, ""))
    ]
    if kind == "postgresql":
        with psycopg.connect(base, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
    else:
        parts = urlsplit(base)
        conn = pymysql.connect(
            host=parts.hostname, port=parts.port, user="root", password="", database=parts.path[1:]
        )
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement.replace("double precision", "double"))
        finally:
            conn.close()
    with pytest.raises(SchemaMismatchError) as info:
        open_tracked(opened, f"{base}?table={refused}", SPEC)
    assert "has column(s) 'extra' the source has not, NOT NULL without a default" in str(info.value)
    sink = open_tracked(opened, f"{base}?table={fine}", SPEC)
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    assert sink.write_changes(*batch(src, 0, 1)) is True
    assert sink.read_rows().num_rows == 1


TEXT_KEY_SPEC = TableSpec(
    "tk", (Column("k", "TEXT", "string", not_null=True), Column("v", "INTEGER", "int64")), ("k",)
)


def assert_keys_kept_apart(sink: Sink) -> None:
    """Keys that differ in letter case or trailing spaces stay rows of their own."""
    keys = ["A", "a", "a ", "a  "]
    src = SourceSim(TEXT_KEY_SPEC)
    src.commit(*(("upsert", {"k": k, "v": i}) for i, k in enumerate(keys)))
    assert sink.write_changes(*batch(src, 0, 1)) is True
    assert sorted(sink.read_rows()["k"].to_pylist()) == keys


def test_postgresql_refuses_an_existing_text_key_column_with_a_nondeterministic_collation(
    postgresql_url: str, opened: list[Sink]
) -> None:
    """Types QA: such a key (ICU, deterministic = false) takes 'A' and 'a' for one row; the
    snapshot failed with PostgreSQL's "cannot affect row a second time"."""
    spec = TEXT_KEY_SPEC
    folding, plain = fresh_name(), fresh_name()
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute(
            "CREATE COLLATION IF NOT EXISTS litecdc_test_ci "
            "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
        )
        for table, collation in ((folding, "litecdc_test_ci"), (plain, "C")):
            conn.execute(
                f'CREATE TABLE "{table}" (k text COLLATE "{collation}" PRIMARY KEY, v bigint, '
                "_litecdc_cid bigint NOT NULL)"
            )
    with pytest.raises(
        SchemaMismatchError,
        match=rf"key column k of .*{folding}.* has the nondeterministic collation "
        "litecdc_test_ci, which takes keys that differ in letter case",
    ):
        open_tracked(opened, f"{postgresql_url}?table={folding}", spec)
    assert_keys_kept_apart(open_tracked(opened, f"{postgresql_url}?table={plain}", spec))


def test_postgresql_refuses_a_nul_character_naming_the_table_column_and_key(
    postgresql_url: str, opened: list[Sink]
) -> None:
    """QA: a NUL in a text value stopped the subscription with 'a value the column cannot
    take: invalid byte sequence for encoding "UTF8": 0x00', naming neither the column nor
    the row; nothing of the batch may be written."""
    sink = open_tracked(opened, f"{postgresql_url}?table={fresh_name()}", COMPOSITE_SPEC)
    src = SourceSim(COMPOSITE_SPEC)
    src.commit(
        ("upsert", {"region": "eu", "n": 1, "value": "ok"}),
        ("upsert", {"region": "eu", "n": 2, "value": "a\x00b"}),
    )
    refused = (
        r"column 'value' of the row of table regions with key \{'region': 'eu', 'n': 2\} "
        r"holds a NUL character \(\\x00\), which PostgreSQL's text cannot store"
    )
    with pytest.raises(SchemaMismatchError, match=refused):
        sink.write_changes(*batch(src, 0, src.cid))
    with pytest.raises(SchemaMismatchError, match=refused):
        sink.write_snapshot(src.chunk("", "\U0010ffff", src.cid))
    assert sink.applied_cid() == 0 and sink.read_rows().num_rows == 0
    # a key holding one: its upsert is refused; its delete is no error (no such row)
    src.commit(("upsert", {"region": "e\x00u", "n": 3, "value": "v"}))
    with pytest.raises(SchemaMismatchError, match="column 'region' of the row"):
        sink.write_changes(*batch(src, src.cid - 1, src.cid))
    src.commit(("delete", ("e\x00u", 3)), ("upsert", {"region": "eu", "n": 2, "value": "fixed"}))
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    assert_mirror(sink, src, Mirror("postgresql", lambda name: name))
    assert sink.write_changes(*batch(src, src.cid - 1, src.cid)) is False


def test_mariadb_refuses_infinity_naming_the_column_and_key(
    mariadb_url: str, opened: list[Sink]
) -> None:
    """QA: ±inf failed with the driver's '-inf can not be used with MySQL', naming
    neither the column nor the row; nothing of the batch may be written."""
    sink = open_tracked(opened, f"{mariadb_url}?table={fresh_name()}", SPEC)
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)), ("upsert", {**sample_row(2), "price": float("-inf")}))
    with pytest.raises(
        SchemaMismatchError, match=r"column 'price' of the row with key \{'id': 2\} holds -inf"
    ):
        sink.write_changes(*batch(src, 0, src.cid))
    assert sink.applied_cid() == 0 and sink.read_rows().num_rows == 0
    with pytest.raises(SchemaMismatchError, match="column 'price'"):
        sink.write_snapshot(src.chunk(0, 10, src.cid))


def test_mariadb_refuses_an_existing_text_key_column_that_folds_case_or_spaces(
    mariadb_url: str, opened: list[Sink]
) -> None:
    """Types QA: an existing mirror with a VARCHAR key in utf8mb4_general_ci was taken, and
    source keys 'A', 'a ' and 'a  ' became one row there, silently. (utf8mb4_bin is PAD
    SPACE too: 'a' and 'a ' are one key.) A NO PAD binary collation compares as SQLite."""
    spec = TEXT_KEY_SPEC
    parts = urlsplit(mariadb_url)
    conn = pymysql.connect(
        host=parts.hostname, port=parts.port, user="root", password="", database=parts.path[1:]
    )
    tables = {collation: fresh_name() for collation in ("utf8mb4_general_ci", "utf8mb4_bin")}
    fine, prefix = fresh_name(), fresh_name()
    try:
        with conn.cursor() as cur:
            for collation, table in [*tables.items(), ("utf8mb4_nopad_bin", fine)]:
                cur.execute(
                    f"CREATE TABLE `{table}` (k VARCHAR(700) COLLATE {collation} NOT NULL "
                    "PRIMARY KEY, v BIGINT, _litecdc_cid BIGINT NOT NULL) CHARSET utf8mb4"
                )
            # (review) a key on the first 3 bytes: 'abcd' and 'abce' would be one row
            cur.execute(
                f"CREATE TABLE `{prefix}` (k VARBINARY(700) NOT NULL, v BIGINT, "
                "_litecdc_cid BIGINT NOT NULL, PRIMARY KEY (k(3)))"
            )
    finally:
        conn.close()
    with pytest.raises(
        SchemaMismatchError, match=r"holds only the first 3 characters or bytes of column k"
    ):
        open_tracked(opened, f"{mariadb_url}?table={prefix}", spec)
    for collation, table in tables.items():
        with pytest.raises(
            SchemaMismatchError,
            match=rf"key column k of .*{table}.* is varchar\(700\) with collation {collation}, "
            "which takes keys that differ in letter case or trailing spaces",
        ):
            open_tracked(opened, f"{mariadb_url}?table={table}", spec)
    assert_keys_kept_apart(open_tracked(opened, f"{mariadb_url}?table={fine}", spec))


def test_mariadb_refuses_names_it_cannot_hold_saying_why(
    mariadb_url: str, opened: list[Sink]
) -> None:
    """Types QA: a name with a character beyond U+FFFF failed every retry, and verify, with
    MariaDB's 'Illegal mix of collations …' (its identifiers are utf8mb3)."""
    rocket = replace(SPEC, columns=(*SPEC.columns, Column("note 🚀", "TEXT", "string")))
    for spec, table, says in [
        (SPEC, "tablé 🚀", r"table name 'tablé 🚀' holds '🚀' \(U\+1F680\), beyond"),
        (rocket, fresh_name(), r"column name 'note 🚀' holds '🚀' .*: rename it at the source"),
        (SPEC, "t" * 65, "is 65 characters, more than the 64 it takes"),
        (SPEC, "trailing ", "ends with a space"),
    ]:
        url = f"{mariadb_url}?table={quote(table)}"
        with pytest.raises(SchemaMismatchError, match=says):
            open_sink(url, spec, "sub")
        sink = open_sink(url, spec, "sub", prepare=False)  # as `pipeline verify` opens it
        try:
            with pytest.raises(SchemaMismatchError, match=says):
                sink.read_rows()
        finally:
            sink.close()
    open_tracked(opened, f"{mariadb_url}?table={quote('tablé ' + 't' * 58)}", SPEC)  # 64: fine


@contextlib.contextmanager
def mariadb_max_packet(url: str, limit: int) -> Iterator[None]:
    """The server's max_allowed_packet set to ``limit`` for new connections, meanwhile."""
    parts = urlsplit(url)
    conn = pymysql.connect(host=parts.hostname, port=parts.port, user="root", password="")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.max_allowed_packet")
            (before,) = cur.fetchone()
            cur.execute(f"SET GLOBAL max_allowed_packet = {int(limit)}")
        try:
            yield
        finally:
            with conn.cursor() as cur:
                cur.execute(f"SET GLOBAL max_allowed_packet = {int(before)}")
    finally:
        conn.close()


def test_mariadb_statements_stay_under_max_allowed_packet(
    mariadb_url: str, opened: list[Sink]
) -> None:
    """QA: up to 1,000 rows went into one INSERT whatever their size: 1,500 rows of 20 KB
    (or 20 of 1 MB) made a statement past the server's max_allowed_packet, refused (or
    the connection dropped) on every retry. A row that alone is too large is named."""
    with mariadb_max_packet(mariadb_url, 1 << 20):  # 1 MiB
        sink = open_tracked(opened, f"{mariadb_url}?table={fresh_name()}", SPEC)
        src = SourceSim(SPEC)
        rows = [{**sample_row(i), "name": f"{i:05d}" * 4000, "data": os.urandom(20_000)}
                for i in range(1, 301)]  # fmt: skip
        src.commit(*[("upsert", row) for row in rows[:150]])
        sink.write_snapshot(src.chunk(0, 151, src.cid))  # about 12 MB of SQL
        src.commit(*[("upsert", row) for row in rows[150:]])
        assert sink.write_changes(*batch(src, 1, src.cid)) is True
        assert_mirror(sink, src, Mirror("mariadb", lambda name: name))

        src.commit(("upsert", {**sample_row(7), "data": os.urandom(600_000)}))  # 1.2 MB as hex
        with pytest.raises(SinkError) as info:
            sink.write_changes(*batch(src, src.cid - 1, src.cid))
        message = str(info.value)
        assert "the row of table items with key {'id': 7} takes " in message
        assert "more than the server's max_allowed_packet (1,048,576 bytes)" in message
        assert "SET GLOBAL max_allowed_packet" in message
        assert sink.applied_cid() == src.cid - 1


def test_mariadb_refuses_a_key_longer_than_its_column_and_skips_its_delete(
    mariadb_url: str, opened: list[Sink]
) -> None:
    """QA: a key value longer than the mirror's VARBINARY(3064) key column failed with the
    server's 'Data too long for column' (no table, no limit), and so did the row's DELETE
    once the source had deleted it — its key went through a staging table with the same
    limit — so the subscription stayed stuck for good."""
    table = fresh_name()
    sink = open_tracked(opened, f"{mariadb_url}?table={table}", COMPOSITE_SPEC)
    src = SourceSim(COMPOSITE_SPEC)
    long_key = "é" * 1600  # 1,600 characters, 3,200 bytes: the limit counts bytes
    src.commit(
        ("upsert", {"region": "short", "n": 1, "value": "a"}),
        ("upsert", {"region": long_key, "n": 2, "value": "b"}),
    )
    refused = (
        rf"{table} at mysql://.*: the row of table regions with key .* cannot be mirrored: key "
        r"column 'region' is varbinary\(3064\), at most 3064 bytes .* its value is 3200 bytes"
    )
    with pytest.raises(UnstorableKeyError, match=refused) as info:
        sink.write_changes(*batch(src, 0, 1))
    assert info.value.keys == [(long_key, 2)]
    assert sink.applied_cid() == 0 and sink.read_rows().num_rows == 0  # nothing of the batch
    with pytest.raises(UnstorableKeyError, match=refused):
        sink.write_snapshot(src.chunk("", "\U0010ffff", 1))
    assert sink.read_rows().num_rows == 0

    # deleted at the source: the batch nets to a delete, which is skipped (no such row)
    src.commit(("delete", (long_key, 2)), ("upsert", {"region": "new", "n": 3, "value": "c"}))
    assert sink.write_changes(*batch(src, 0, 2)) is True
    assert_mirror(sink, src, Mirror("mariadb", fresh_name))
    # again, the delete in a batch of its own (the insert's batch was applied without the
    # refused row, as the server does when a later commit deletes it)
    src.commit(("upsert", {"region": long_key, "n": 4, "value": "d"}))
    events, _ = batch(src, 2, 3)
    assert sink.write_changes(events.filter(pc.equal(events["n"], -1)), ChangeBatch("sub", 2, 3))
    src.commit(("delete", (long_key, 4)), ("upsert", {"region": "short", "n": 1, "value": "z"}))
    assert sink.write_changes(*batch(src, 3, 4)) is True
    assert_mirror(sink, src, Mirror("mariadb", fresh_name))


def test_mariadb_blob_key_column_holds_3072_bytes_and_no_more(
    mariadb_url: str, opened: list[Sink]
) -> None:
    spec = TableSpec(
        "blobs",
        (Column("k", "BLOB", "binary", not_null=True), Column("v", "TEXT", "string")),
        ("k",),
    )
    sink = open_tracked(opened, f"{mariadb_url}?table={fresh_name()}", spec)
    src = SourceSim(spec)
    src.commit(("upsert", {"k": b"\xff" * 3072, "v": "fits"}))
    src.commit(("upsert", {"k": b"\x00" * 3073, "v": "does not"}))
    assert sink.write_changes(*batch(src, 0, 1)) is True
    with pytest.raises(UnstorableKeyError, match=r"'k' is varbinary\(3072\), at most 3072 bytes"):
        sink.write_changes(*batch(src, 1, 2))
    assert sink.read_rows()["v"].to_pylist() == ["fits"]


def test_postgresql_refuses_a_key_its_index_cannot_hold_and_applies_its_delete(
    postgresql_url: str, opened: list[Sink]
) -> None:
    """QA: a primary key longer than a btree index entry holds (2,704 bytes, after
    compression) failed with PostgreSQL's 'index row size 3024 exceeds btree version 4
    maximum 2704 for index …' as a plain SinkError naming no row, so the server could not
    skip the row once the source deleted it: the subscription stayed stuck for good."""
    table = fresh_name()
    sink = open_tracked(opened, f"{postgresql_url}?table={table}", COMPOSITE_SPEC)
    src = SourceSim(COMPOSITE_SPEC)
    too_long = incompressible(3000)
    src.commit(
        ("upsert", {"region": "short", "n": 1, "value": "a"}),
        ("upsert", {"region": too_long, "n": 2, "value": "b"}),
        ("upsert", {"region": "k" * 100_000, "n": 3, "value": "c"}),  # compresses: it fits
        ("upsert", {"region": "k" * 1_000_000, "n": 4, "value": "d"}),  # even compressed not
    )
    refused = (
        rf"public\.{table} at postgresql://.*: the row of table regions with key .* cannot be "
        r"mirrored: key column 'region' holds 3000 bytes, more than an entry of the mirror's "
        r"primary key index holds \(at most 2704 bytes, after compression; PostgreSQL: index "
        r"row size \d+ exceeds btree version 4 maximum 2704 .*\) \(and 1 more row\(s\)\): "
        "delete the row or shorten its key at the source"
    )
    with pytest.raises(UnstorableKeyError, match=refused) as info:
        sink.write_changes(*batch(src, 0, 1))
    assert info.value.keys == [(too_long, 2), ("k" * 1_000_000, 4)]
    assert sink.applied_cid() == 0 and sink.read_rows().num_rows == 0  # nothing of the batch
    with pytest.raises(UnstorableKeyError, match=refused):
        sink.write_snapshot(src.chunk("", "\U0010ffff", 1))
    assert sink.read_rows().num_rows == 0

    # deleted at the source: the batch nets to deletes, which find nothing to delete
    src.commit(
        ("delete", (too_long, 2)),
        ("delete", ("k" * 1_000_000, 4)),
        ("upsert", {"region": "new", "n": 5, "value": "e"}),
    )
    assert sink.write_changes(*batch(src, 0, 2)) is True
    assert_mirror(sink, src, Mirror("postgresql", fresh_name))
    # again, the delete in a batch of its own (the insert's batch was applied without the
    # refused row, as the server does when a later commit deletes it); a key beyond the
    # 8,191 bytes of any index entry
    beyond = incompressible(10_000, seed=1)
    src.commit(("upsert", {"region": beyond, "n": 6, "value": "f"}))
    with pytest.raises(UnstorableKeyError, match="'region' holds 10000 bytes") as info:
        sink.write_changes(*batch(src, 2, 3))
    assert info.value.keys == [(beyond, 6)]
    events, _ = batch(src, 2, 3)
    assert sink.write_changes(events.filter(pc.equal(events["n"], -1)), ChangeBatch("sub", 2, 3))
    src.commit(("delete", (beyond, 6)), ("upsert", {"region": "short", "n": 1, "value": "z"}))
    assert sink.write_changes(*batch(src, 3, 4)) is True
    assert_mirror(sink, src, Mirror("postgresql", fresh_name))


def test_postgresql_refuses_names_it_would_cut_to_63_bytes(
    postgresql_url: str, opened: list[Sink]
) -> None:
    """QA: PostgreSQL keeps 63 bytes of a name, with a notice only: a column added later,
    alike in its first 63 bytes to one there, was skipped by ADD COLUMN IF NOT EXISTS,
    and every write then failed with 'column … specified more than once'."""
    longest = "c" * 61 + "é"  # 63 bytes: kept whole
    spec = replace(SPEC, columns=(*SPEC.columns, Column(longest, "TEXT", "string")))
    sink = open_tracked(opened, f"{postgresql_url}?table={fresh_name()}", spec)
    twin = longest + "_2"
    wider = replace(spec, columns=(*spec.columns, Column(twin, "TEXT", "string")))
    with pytest.raises(SchemaMismatchError) as info:
        sink.evolve(wider)
    assert f"column name {twin!r} is 65 bytes, more than PostgreSQL keeps of a name (63" in (
        str(info.value)
    )
    assert "rename it at the source" in str(info.value)
    with pytest.raises(SchemaMismatchError, match=r"table name 't{64}' is 64 bytes"):
        open_sink(f"{postgresql_url}?table={'t' * 64}", SPEC, "sub")


def test_postgresql_key_probe_fires_no_trigger_of_the_mirror(
    postgresql_url: str, opened: list[Sink]
) -> None:
    """Which keys PostgreSQL refuses is found by inserting them again, rolled back; on the
    mirror itself a user's trigger fired once more, and what it did outside the transaction
    stayed (here a sequence's nextval). The probe goes to an empty copy of the mirror."""
    table, counter = fresh_name(), fresh_name()
    sink = open_tracked(opened, f"{postgresql_url}?table={table}", COMPOSITE_SPEC)
    src = SourceSim(COMPOSITE_SPEC)
    src.commit(("upsert", {"region": "short", "n": 1, "value": "a"}))
    assert sink.write_changes(*batch(src, 0, 1)) is True  # the mirror exists
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute(f"CREATE SEQUENCE {counter}")
        conn.execute(
            f"CREATE FUNCTION {counter}_count() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM nextval('{counter}'); RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER {counter}_each BEFORE INSERT ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {counter}_count()"
        )
    src.commit(("upsert", {"region": incompressible(3000), "n": 2, "value": "b"}))
    with pytest.raises(UnstorableKeyError, match="'region' holds 3000 bytes"):
        sink.write_changes(*batch(src, 1, 2))
    with psycopg.connect(postgresql_url) as conn:
        row = conn.execute(f"SELECT last_value, is_called FROM {counter}").fetchone()
    assert row == (1, True)  # by the write that failed (as any write fires it), once


@pytest.mark.parametrize(
    ("sqlite_type", "arrow", "value"),
    [
        ("TEXT", "string", incompressible),
        ("BLOB", "binary", lambda n: incompressible(n).encode()),
    ],
)
def test_postgresql_key_index_holds_2692_incompressible_bytes_and_no_more(
    postgresql_url: str,
    opened: list[Sink],
    sqlite_type: str,
    arrow: str,
    value: Callable[[int], object],
) -> None:
    """A btree entry holds 2,704 bytes: 8 of the entry's header, 4 of the value's length,
    and 2,692 of a key that does not compress (measured on PostgreSQL 15, text and bytea)."""
    spec = TableSpec(
        "keys", (Column("k", sqlite_type, arrow, not_null=True), Column("v", "TEXT", "string")),
        ("k",),
    )  # fmt: skip
    sink = open_tracked(opened, f"{postgresql_url}?table={fresh_name()}", spec)
    src = SourceSim(spec)
    src.commit(("upsert", {"k": value(2692), "v": "fits"}))
    src.commit(("upsert", {"k": value(2693), "v": "does not"}))
    assert sink.write_changes(*batch(src, 0, 1)) is True
    with pytest.raises(
        UnstorableKeyError,
        match=r"'k' holds 2693 bytes, .*\(at most 2704 bytes, after compression;",
    ):
        sink.write_changes(*batch(src, 1, 2))
    assert sink.read_rows()["v"].to_pylist() == ["fits"]


def test_rabbitmq_exchange_without_a_bound_queue_fails_instead_of_dropping(
    rabbitmq_url: str, opened: list[Sink]
) -> None:
    """QA: with ?exchange= and no queue bound (the sink declares the exchange itself),
    every message was dropped and the run reported the batch applied."""
    exchange, queue = f"x{uuid.uuid4().hex[:10]}", f"q{uuid.uuid4().hex[:10]}"
    sink = open_tracked(opened, f"{rabbitmq_url}?exchange={exchange}", SPEC)
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    with pytest.raises(SinkError, match=f"no queue bound to exchange '{exchange}'"):
        sink.write_changes(*batch(src, 0, src.cid))
    assert sink.applied_cid() == 0
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, routing_key=f"litecdc.{SPEC.name}.#")
    finally:
        conn.close()
    assert sink.write_changes(*batch(src, 0, src.cid)) is True  # the retry now arrives
    assert [doc["cid"] for _, doc in rabbitmq_messages(rabbitmq_url, queue)] == [1]


# -- RabbitMQ: many publishes awaiting their confirms ----------------------------------


def small_row(i: int) -> dict[str, object]:
    """``sample_row`` without its 70 kB blob: a batch of thousands of messages stays small."""
    return {**sample_row(i), "data": None if i % 6 == 0 else i.to_bytes(4, "big")}


def upserts(src: SourceSim, first: int, last: int, per_commit: int = 500) -> None:
    """Rows ``first``..``last`` inserted, ``per_commit`` to a transaction."""
    for lo in range(first, last + 1, per_commit):
        src.commit(*[("upsert", small_row(i)) for i in range(lo, min(lo + per_commit, last + 1))])


@contextlib.contextmanager
def amqp(url: str) -> Iterator[Any]:
    """A channel of a connection of its own (pika's blocking client)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield conn.channel()
    finally:
        conn.close()


def topic_exchange_with_queue(url: str, routing_key: str, **queue_args: object) -> tuple[str, str]:
    """A new durable topic exchange and a queue bound to it with ``routing_key``."""
    tag = uuid.uuid4().hex[:10]
    exchange, queue = f"x{tag}", f"q{tag}"
    with amqp(url) as channel:
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_declare(queue, durable=True, arguments=queue_args or None)
        channel.queue_bind(queue, exchange, routing_key=routing_key)
    return exchange, queue


def publish_midway(monkeypatch: pytest.MonkeyPatch, after: int, action: Callable[[], None]) -> None:
    """Make the RabbitMQ sink run ``action`` once ``after`` messages of a change batch are
    published: more than ``IN_FLIGHT``, so some are still unconfirmed."""
    real = rabbitmq.event_messages

    def messages(events: pa.Table, spec: TableSpec) -> Iterator[tuple[str, dict[str, object]]]:
        for n, message in enumerate(real(events, spec)):
            if n == after:
                action()
            yield message

    monkeypatch.setattr(rabbitmq, "event_messages", messages)


def test_rabbitmq_keeps_order_across_a_batch_larger_than_the_in_flight_window(
    rabbitmq_url: str, opened: list[Sink]
) -> None:
    """The sink publishes up to IN_FLIGHT messages ahead of their confirms: a batch of
    more than twice that arrives whole, once each, in (cid, seq) order."""
    count = 2 * rabbitmq.IN_FLIGHT + 7
    src = SourceSim(SPEC)
    upserts(src, 1, count)
    src.commit(("delete", (3,)), ("rekey", ((4,), {**small_row(4), "id": count + 1})))
    queue = f"q{uuid.uuid4().hex[:10]}"
    sink = open_tracked(opened, f"{rabbitmq_url}?queue={queue}", SPEC)
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    got = unscoped(rabbitmq_messages(rabbitmq_url, queue))
    assert len(got) == count + 3
    assert got == expected_messages(src, 0, src.cid)


def test_rabbitmq_bounds_the_bytes_in_flight_too(
    rabbitmq_url: str, opened: list[Sink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """RabbitMQ QA: the window was counted in messages only — 2000 rows of 200 KB took
    +894 MB. With a byte bound far below a window's worth, every message still arrives,
    in order."""
    monkeypatch.setattr(rabbitmq, "IN_FLIGHT_BYTES", 20_000)
    src = SourceSim(SPEC)
    src.commit(*[("upsert", {**sample_row(i), "data": bytes(3000)}) for i in range(1, 120)])
    queue = f"q{uuid.uuid4().hex[:10]}"
    sink = open_tracked(opened, f"{rabbitmq_url}?queue={queue}", SPEC)
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    assert unscoped(rabbitmq_messages(rabbitmq_url, queue)) == expected_messages(src, 0, src.cid)


@pytest.mark.parametrize(
    "arguments",
    [{"x-queue-type": "quorum"}, {"x-max-length": 100000, "x-message-ttl": 3600000}],
)
def test_rabbitmq_takes_an_existing_queue_as_it_is(
    rabbitmq_url: str, opened: list[Sink], arguments: dict[str, object]
) -> None:
    """RabbitMQ QA: ?queue= declared the queue again with no arguments, which the broker
    refuses for a queue made with some (a quorum queue: 406 PRECONDITION_FAILED), and the
    error said only '406' and to check the credentials."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        conn.channel().queue_declare(queue, durable=True, arguments=arguments)
    finally:
        conn.close()
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 4)])
    sink = open_tracked(opened, f"{rabbitmq_url}?queue={queue}", SPEC)
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    assert unscoped(rabbitmq_messages(rabbitmq_url, queue)) == expected_messages(src, 0, src.cid)


def test_rabbitmq_refuses_a_routing_key_longer_than_amqp_allows(rabbitmq_url: str) -> None:
    """RabbitMQ QA: a table name of 240+ bytes made 'litecdc.<table>.snapshot_done' too
    long for AMQP, and every snapshot failed with only the key's bytes as the error."""
    spec = replace(SPEC, name="t" * 240)
    with pytest.raises(SinkError, match=r"longer than AMQP's 255 bytes .*publish to a queue"):
        open_sink(f"{rabbitmq_url}?exchange=x", spec, "sub", prepare=False)
    with pytest.raises(SinkError, match=r"queue name 'qqq.*give a shorter"):
        open_sink(f"{rabbitmq_url}?queue={'q' * 256}", SPEC, "sub", prepare=False)


def test_rabbitmq_unroutable_message_in_the_middle_of_a_batch_fails_it(
    rabbitmq_url: str, opened: list[Sink]
) -> None:
    """A message no queue takes, with more than IN_FLIGHT around it in flight, fails the
    batch: its return comes back after later messages went out, and nothing counts as
    applied. The error names the message."""
    # a queue for upserts only: the one delete, in the middle of the batch, has none
    exchange, queue = topic_exchange_with_queue(rabbitmq_url, f"litecdc.{SPEC.name}.upsert")
    src = SourceSim(SPEC)
    upserts(src, 1, rabbitmq.IN_FLIGHT)
    middle = src.commit(("delete", (1,)))
    upserts(src, rabbitmq.IN_FLIGHT + 1, 2 * rabbitmq.IN_FLIGHT)
    sink = open_tracked(opened, f"{rabbitmq_url}?exchange={exchange}", SPEC)
    with pytest.raises(SinkError) as info:
        sink.write_changes(*batch(src, 0, src.cid))
    message = str(info.value)
    assert f"no queue bound to exchange '{exchange}'" in message
    assert f"message sub:{middle}-0-delete returned (312 NO_ROUTE)" in message
    assert f"bind a queue (e.g. with litecdc.{SPEC.name}.#)" in message
    assert sink.applied_cid() == 0
    first_try = unscoped(rabbitmq_messages(rabbitmq_url, queue))  # upserts up to where it stopped
    expected = expected_messages(src, 0, src.cid)
    assert first_try == [m for m in expected if m[1]["op"] == "upsert"][: len(first_try)]

    with amqp(rabbitmq_url) as channel:  # every op now has a queue: the retry arrives whole
        channel.queue_bind(queue, exchange, routing_key=f"litecdc.{SPEC.name}.#")
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    assert sink.applied_cid() == src.cid
    assert unscoped(rabbitmq_messages(rabbitmq_url, queue)) == expected


def test_rabbitmq_refused_message_in_the_middle_of_a_batch_fails_it(
    rabbitmq_url: str, opened: list[Sink]
) -> None:
    """A queue at its length limit refuses what comes beyond it (x-overflow
    reject-publish: the broker nacks those messages). Refused in the middle of a batch
    with more than IN_FLIGHT in flight, the batch fails and nothing counts as applied;
    once a queue takes them, the retry arrives whole."""
    limit = rabbitmq.IN_FLIGHT + 100
    exchange, full = topic_exchange_with_queue(
        rabbitmq_url,
        f"litecdc.{SPEC.name}.#",
        **{"x-max-length": limit, "x-overflow": "reject-publish"},
    )
    src = SourceSim(SPEC)
    upserts(src, 1, 2 * rabbitmq.IN_FLIGHT + 100)
    expected = expected_messages(src, 0, src.cid)
    sink = open_tracked(opened, f"{rabbitmq_url}?exchange={exchange}", SPEC)
    with pytest.raises(SinkError) as info:
        sink.write_changes(*batch(src, 0, src.cid))
    message = str(info.value)
    assert "the broker refused a message" in message
    assert f"a queue bound to exchange {exchange!r} is full (x-max-length" in message
    assert "check the credentials" not in message
    refused = re.search(r"basic\.nack of message sub:(\d+-\d+-upsert)", message)
    assert refused is not None, message
    assert refused[1] in [msg_id for msg_id, _ in expected[limit:]]
    assert sink.applied_cid() == 0
    assert unscoped(rabbitmq_messages(rabbitmq_url, full)) == expected[:limit]

    with amqp(rabbitmq_url) as channel:
        channel.queue_delete(full)
        queue = f"q{uuid.uuid4().hex[:10]}"
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, routing_key=f"litecdc.{SPEC.name}.#")
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    assert unscoped(rabbitmq_messages(rabbitmq_url, queue)) == expected


def test_rabbitmq_resource_alarm_fails_the_batch_after_the_blocked_timeout(
    rabbitmq_server: RabbitMQServer, opened: list[Sink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker short of memory blocks publishers (a resource alarm, raised here for real by
    lowering its memory watermark): the batch fails after BLOCKED_TIMEOUT saying why,
    instead of holding the server's other subscriptions up; a retry while it still blocks
    fails too, sending nothing; once the alarm clears the retry waits until the broker
    took what the first attempt sent, then arrives whole after it. (Pipeline QA: the
    blocked connection was closed and each retry sent on a new one; the broker took every
    attempt's unread messages once the alarm cleared, interleaved.)"""
    monkeypatch.setattr(rabbitmq, "BLOCKED_TIMEOUT", 2.0)
    queue = f"q{uuid.uuid4().hex[:10]}"
    src = SourceSim(SPEC)
    upserts(src, 1, 300)
    expected = expected_messages(src, 0, src.cid)
    sink = open_tracked(opened, f"{rabbitmq_server.url}?queue={queue}", SPEC)
    rabbitmq_server.ctl("set_vm_memory_high_watermark", "0.00001")
    try:
        with pytest.raises(SinkError) as info:
            sink.write_changes(*batch(src, 0, src.cid))
        with pytest.raises(SinkError) as again:  # still blocked: nothing more is sent
            sink.write_changes(*batch(src, 0, src.cid))
    finally:
        rabbitmq_server.ctl("set_vm_memory_high_watermark", "0.4")  # RabbitMQ's default
    port = urlsplit(rabbitmq_server.url).port
    for message in (str(info.value), str(again.value)):
        assert f"the broker at 127.0.0.1:{port} blocked the connection for more than 2 s" in (
            message
        )
        assert "a resource alarm: memory or disk is short there" in message
        assert "retried once the broker took or refused what was sent of it" in message
    assert sink.applied_cid() == 0
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    # what the first attempt sent comes first (at least once: consumers drop those
    # duplicates by message id), then the whole retry — no other copy, none interleaved
    got = unscoped(rabbitmq_messages(rabbitmq_server.url, queue))
    taken_before = len(got) - len(expected)
    assert 0 <= taken_before <= len(expected)
    assert got[:taken_before] == expected[:taken_before]
    assert got[taken_before:] == expected


def test_rabbitmq_broker_gone_mid_batch_fails_it_and_the_next_prepare_reconnects(
    rabbitmq_url: str, opened: list[Sink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops with messages in flight (the broker went away): the batch
    fails at once with the reason, nothing counts as applied, and the next prepare()
    connects again."""
    broker = urlsplit(rabbitmq_url)
    assert broker.port is not None
    queue = f"q{uuid.uuid4().hex[:10]}"
    src = SourceSim(SPEC)
    upserts(src, 1, 2 * rabbitmq.IN_FLIGHT)
    expected = expected_messages(src, 0, src.cid)
    with TcpProxy("127.0.0.1", broker.port) as proxy:
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/?queue={queue}"
        sink = open_tracked(opened, url, SPEC)
        publish_midway(monkeypatch, rabbitmq.IN_FLIGHT + 10, proxy.cut)
        with pytest.raises(SinkError) as info:
            sink.write_changes(*batch(src, 0, src.cid))
        message = str(info.value)
        assert proxy.cuts == 1
        assert f"the connection to the broker at 127.0.0.1:{proxy.port} was lost" in message
        assert "the batch is retried on a new connection" in message
        assert sink.applied_cid() == 0
        monkeypatch.undo()
        sink.prepare()
        assert sink.write_changes(*batch(src, 0, src.cid)) is True
    got = unscoped(rabbitmq_messages(rabbitmq_url, queue))
    first_try = len(got) - len(expected)  # what reached the queue before the cut
    assert 0 <= first_try < len(expected)
    assert got == expected[:first_try] + expected


def test_rabbitmq_channel_closed_by_the_broker_mid_batch_fails_it(
    rabbitmq_url: str, opened: list[Sink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker closes the channel with messages in flight (here: their exchange was
    deleted meanwhile, 404): the batch fails with the broker's reason, nothing counts as
    applied, and the next prepare() declares the exchange again on a new connection."""
    exchange, queue = topic_exchange_with_queue(rabbitmq_url, f"litecdc.{SPEC.name}.#")
    src = SourceSim(SPEC)
    upserts(src, 1, 2 * rabbitmq.IN_FLIGHT)
    expected = expected_messages(src, 0, src.cid)
    sink = open_tracked(opened, f"{rabbitmq_url}?exchange={exchange}", SPEC)

    def delete_exchange() -> None:
        with amqp(rabbitmq_url) as channel:
            channel.exchange_delete(exchange)

    publish_midway(monkeypatch, rabbitmq.IN_FLIGHT + 10, delete_exchange)
    with pytest.raises(SinkError) as info:
        sink.write_changes(*batch(src, 0, src.cid))
    message = str(info.value)
    assert f"the broker closed the channel: 404 NOT_FOUND - no exchange '{exchange}'" in message
    assert sink.applied_cid() == 0
    monkeypatch.undo()
    sink.prepare()  # declares the exchange again: bind the queue to it, as before
    with amqp(rabbitmq_url) as channel:
        channel.queue_bind(queue, exchange, routing_key=f"litecdc.{SPEC.name}.#")
    assert sink.write_changes(*batch(src, 0, src.cid)) is True
    got = unscoped(rabbitmq_messages(rabbitmq_url, queue))
    first_try = len(got) - len(expected)
    assert 0 <= first_try <= rabbitmq.IN_FLIGHT + 10
    assert got == expected[:first_try] + expected


# -- logs -------------------------------------------------------------------------------

LOGS = ["nats", "rabbitmq", "webhook"]


@dataclass
class LogTarget:
    kind: str
    url: str
    consume: Callable[[], list[Message]]  # everything stored/received so far, in order
    receiver: WebhookReceiver | None = None


def unscoped(found: list[Message], sub: str = "sub") -> list[Message]:
    """Messages with their de-duplication ids as the sink made them, without the
    ``<subscription>:`` prefix every one must carry (a sink used on its own has no
    registration to add)."""
    for msg_id, _ in found:
        assert msg_id.startswith(f"{sub}:"), msg_id
    return [(msg_id[len(sub) + 1 :], doc) for msg_id, doc in found]


def nats_messages(server: str, stream: str, sub: str = "sub") -> list[Message]:
    """The stream's messages with their ``Nats-Msg-Id`` (``unscoped``)."""
    return unscoped(nats_raw_messages(server, stream), sub)


def webhook_raw_messages(receiver: WebhookReceiver) -> list[Message]:
    """The events the receiver accepted, with their ``id`` as sent."""
    out: list[Message] = []
    for doc in receiver.batches:
        for event in doc.get("events", []):
            out.append((event.pop("id"), event))
    return out


def webhook_messages(receiver: WebhookReceiver, sub: str = "sub") -> list[Message]:
    return unscoped(webhook_raw_messages(receiver), sub)


@pytest.fixture(params=LOGS)
def log_target(request: pytest.FixtureRequest) -> Iterator[LogTarget]:
    kind = request.param
    tag = uuid.uuid4().hex[:10]
    if kind == "nats":
        server = request.getfixturevalue("nats_url")
        stream = f"S{tag}"
        url = f"{server}?stream={stream}&subject=t{tag}"
        yield LogTarget(kind, url, lambda: nats_messages(server, stream))
    elif kind == "rabbitmq":
        base = request.getfixturevalue("rabbitmq_url")
        queue = f"q{tag}"
        url = f"{base}?queue={queue}"
        yield LogTarget(kind, url, lambda: unscoped(rabbitmq_messages(base, queue)))
    else:
        with WebhookReceiver() as receiver:
            yield LogTarget(kind, receiver.url, lambda: webhook_messages(receiver), receiver)


def expected_messages(src: SourceSim, after: int, end: int) -> list[Message]:
    out: list[Message] = []
    for cid, seq, op, row in src.events_log:
        if after < cid <= end:
            body = {
                c: (base64.b64encode(v).decode() if isinstance(v, bytes) else v)
                for c, v in row.items()
            }
            doc = {"table": src.spec.name, "op": op, "cid": cid, "seq": seq}
            doc |= {"key": {k: body[k] for k in src.spec.key}, "row": body}
            out.append((message_id(cid, seq, op), doc))
    return out


def test_log_sink_sends_each_event_once_with_its_id(
    log_target: LogTarget, opened: list[Sink]
) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 13)])
    src.commit(("delete", (3,)), ("upsert", {**sample_row(4), "n": 2**62}))
    src.commit(("rekey", ((5,), {**sample_row(5), "id": 50})))
    sink = open_tracked(opened, log_target.url, SPEC)
    assert sink.kind == "log"
    assert sink.write_changes(*batch(src, 0, 2)) is True
    assert sink.write_changes(*batch(src, 2, 3)) is True
    assert sink.applied_cid() == 3
    # replays of applied batches send nothing
    assert sink.write_changes(*batch(src, 0, 2)) is False
    assert sink.write_changes(*batch(src, 2, 3)) is False
    got = log_target.consume()
    assert got == expected_messages(src, 0, 3)
    assert len({msg_id for msg_id, _ in got}) == len(got)


def test_log_sink_snapshot_rows(log_target: LogTarget, opened: list[Sink]) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 6)])
    sink = open_tracked(opened, log_target.url, SPEC)
    sink.write_snapshot(src.chunk(0, 100, 1))
    got = log_target.consume()
    assert [doc["op"] for _, doc in got] == ["snapshot"] * 5
    assert [doc["key"] for _, doc in got] == [{"id": i} for i in range(1, 6)]
    assert all(doc["cid"] == 1 for _, doc in got)
    assert len({msg_id for msg_id, _ in got}) == 5


@pytest.mark.parametrize("kind", ["nats", "rabbitmq"])
def test_message_sink_ends_a_snapshot_with_a_snapshot_done_message(
    kind: str, request: pytest.FixtureRequest, opened: list[Sink]
) -> None:
    """A consumer of NATS or RabbitMQ had no word of a snapshot's end (the webhook has
    'snapshot_done'): after a re-snapshot it could not tell which rows it held were gone
    at the source, their deletes pruned before the re-snapshot (pipeline QA)."""
    tag = uuid.uuid4().hex[:10]
    read: Callable[[], list[Message]]
    if kind == "nats":
        server = request.getfixturevalue("nats_url")
        url = f"{server}?stream=S{tag}&subject=t{tag}"

        def read() -> list[Message]:
            return nats_messages(server, f"S{tag}")
    else:
        # an exchange with a queue bound as the docs say (litecdc.<table>.#): the marker's
        # routing key litecdc.<table>.snapshot_done reaches it
        base, exchange = request.getfixturevalue("rabbitmq_url"), f"x{tag}"
        url = f"{base}?exchange={exchange}"
        conn = pika.BlockingConnection(pika.URLParameters(base))
        try:
            channel = conn.channel()
            channel.exchange_declare(exchange, "topic", durable=True)
            channel.queue_declare(f"q{tag}", durable=True)
            channel.queue_bind(f"q{tag}", exchange, routing_key=f"litecdc.{SPEC.name}.#")
        finally:
            conn.close()

        def read() -> list[Message]:
            return unscoped(rabbitmq_messages(base, f"q{tag}"))

    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 4)])
    init = src.cid
    sink = open_tracked(opened, url, SPEC)
    sink.write_snapshot(src.chunk(0, 100, init))
    assert sink.finish_snapshot(init) == 0  # nothing swept: the consumer does it
    got = read()
    assert [doc["op"] for _, doc in got] == ["snapshot"] * 3 + ["snapshot_done"]
    done = {"table": SPEC.name, "op": "snapshot_done", "cid": init}
    assert got[-1] == (f"{init}-snapshot-done", {**done, "seq": None, "key": None, "row": None})
    # a retried end (a crash before it was recorded) carries the same id
    sink.finish_snapshot(init)
    again = read()
    if kind == "nats":  # JetStream drops the duplicate itself
        assert again == got
    else:
        assert again == [got[-1]]


def test_log_sink_writes_infinity_as_an_untyped_column_carries_it(
    log_target: LogTarget, opened: list[Sink]
) -> None:
    """QA: a REAL column's ±inf was "Infinity"/"-Infinity", an untyped column's (text from
    the node, as Python writes the number) "inf"/"-inf": now both the latter."""
    src = SourceSim(SPEC)
    src.commit(
        ("upsert", {**sample_row(1), "price": float("inf")}),
        ("upsert", {**sample_row(2), "price": float("-inf")}),
    )
    sink = open_tracked(opened, log_target.url, SPEC)
    sink.write_snapshot(src.chunk(0, 100, 1))
    assert sink.write_changes(*batch(src, 0, 1)) is True
    assert [(doc["op"], doc["row"]["price"]) for _, doc in log_target.consume()] == [
        ("snapshot", "inf"),
        ("snapshot", "-inf"),
        ("upsert", "inf"),
        ("upsert", "-inf"),
    ]


def test_nats_forgets_progress_an_earlier_subscription_of_the_name_left(
    nats_url: str, opened: list[Sink]
) -> None:
    """The server calls forget_progress when a subscription registers: a new one reusing an
    old name (on another source, with lower cids) would skip its changes up to the old cid."""
    tag = uuid.uuid4().hex[:10]
    url = f"{nats_url}?stream=S{tag}&subject=t{tag}"
    src = SourceSim(SPEC)
    old = open_tracked(opened, url, SPEC, sub="reused")
    assert old.write_changes(src.events(0, 0), ChangeBatch("reused", 0, 10**6)) is True
    src.commit(("upsert", sample_row(1)))
    new = open_tracked(opened, url, SPEC, sub="reused")
    assert new.write_changes(*batch(src, 0, 1, sub="reused")) is False  # what went wrong
    new.forget_progress()
    assert new.applied_cid() == 0
    assert new.write_changes(*batch(src, 0, 1, sub="reused")) is True
    assert new.applied_cid() == 1
    new.forget_progress()  # nothing recorded: nothing to forget
    other = open_tracked(opened, url, SPEC, sub="other")
    other.forget_progress()


def test_nats_drops_a_replayed_publish_and_keeps_progress(
    nats_url: str, opened: list[Sink]
) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 4)])
    src.commit(("delete", (2,)))
    tag = uuid.uuid4().hex[:10]
    url = f"{nats_url}?stream=S{tag}&subject=t{tag}"
    first = open_sink(url, SPEC, "sub")
    assert first.write_changes(*batch(src, 0, 2)) is True
    first.close()
    # a new process has the progress (KV) ...
    second = open_tracked(opened, url, SPEC)
    assert second.applied_cid() == 2
    assert second.write_changes(*batch(src, 0, 2)) is False
    # ... and a publish replayed after a crash (progress not yet recorded) is dropped
    # by JetStream's duplicate window
    assert isinstance(second, NatsSink)
    asyncio.run(forget_progress(nats_url, second.state_key))
    replayed = open_tracked(opened, url, SPEC)
    assert replayed.write_changes(*batch(src, 0, 2)) is True
    got = nats_messages(nats_url, f"S{tag}")
    assert got == expected_messages(src, 0, 2)


def test_nats_names_a_row_over_the_servers_max_payload(nats_url: str, opened: list[Sink]) -> None:
    """Sinks QA: a row whose message is over the server's max_payload (1 MB by default)
    failed every batch with "nats: maximum payload exceeded: check the server is up and
    has JetStream enabled", naming neither the row nor the limit."""
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)), ("upsert", {**sample_row(2), "data": b"x" * 1_100_000}))
    tag = uuid.uuid4().hex[:10]
    sink = open_tracked(opened, f"{nats_url}?stream=S{tag}&subject=t{tag}", SPEC)
    with pytest.raises(SinkError) as refused:
        sink.write_changes(*batch(src, 0, 1))
    message = str(refused.value)
    assert message.startswith(
        "nats sink: the upsert event of items with key {'id': 2} (cid 1) is a 1,466,"
    ), message
    assert "over the NATS server's max_payload of 1,048,576 bytes" in message
    assert "max_payload in nats-server's configuration" in message
    assert "check the server is up" not in message
    with pytest.raises(SinkError, match=r"nats sink: the snapshot row of items with key"):
        sink.write_snapshot(src.chunk(0, 100, 1))

    # review: the limit counts the message with its headers, exactly (a fixed allowance
    # for headers refused messages the server takes)
    from litecdc.pipeline.sinks.messages import encode, event_messages, scoped_id

    assert isinstance(sink, NatsSink)

    def size(blob_bytes: int, cid: int) -> int:
        row = {**sample_row(3), "data": b"y" * blob_bytes}
        events = SourceSim(SPEC)
        for _ in range(cid):
            events.commit(("upsert", row))
        msg_id, doc = next(iter(event_messages(events.events(cid - 1, cid), SPEC)))
        scoped = scoped_id(sink.subscription, sink.registration, msg_id)
        headers = f"Nats-Msg-Id: {scoped}\r\nNats-Expected-Stream: S{tag}\r\n"
        return len(encode(doc)) + len(f"NATS/1.0\r\n{headers}\r\n")

    blob = 786_000
    while size(blob + 3, src.cid + 1) <= 1_048_576:
        blob += 3
    assert 1_048_576 - 1024 < size(blob, src.cid + 1) <= 1_048_576
    src.commit(("upsert", {**sample_row(3), "data": b"y" * blob}))
    assert sink.write_changes(*batch(src, 1, src.cid)) is True  # right under the limit


def test_nats_refusals_of_the_server_come_without_the_is_it_up_hint(
    nats_url: str, opened: list[Sink]
) -> None:
    """Sinks QA: "check the server is up and has JetStream enabled" followed the server's
    own clear refusals too (here: another stream already takes the subjects)."""
    tag = uuid.uuid4().hex[:10]
    open_tracked(opened, f"{nats_url}?stream=A{tag}&subject=t{tag}", SPEC)
    with pytest.raises(SinkError) as refused:
        open_tracked(opened, f"{nats_url}?stream=B{tag}&subject=t{tag}", SPEC)
    assert "subjects overlap" in str(refused.value)
    assert "check the server is up" not in str(refused.value)
    unreachable = f"nats://127.0.0.1:{closed_port()}?connect_timeout=1"
    with pytest.raises(SinkError, match="check the server is up and has JetStream enabled"):
        open_tracked(opened, unreachable, SPEC)


async def forget_progress(server: str, key: str) -> None:
    nc = await nats.connect(server)
    try:
        kv = await nc.jetstream().key_value(STATE_BUCKET)
        await kv.delete(key)
    finally:
        await nc.close()


def test_nats_keeps_two_sources_equal_ids_apart(nats_url: str, opened: list[Sink]) -> None:
    """QA: two sources (here two subscriptions) publishing into one stream gave their
    changes the same cid-seq-op id, and JetStream dropped the second as a duplicate."""
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    tag = uuid.uuid4().hex[:10]
    url = f"{nats_url}?stream=S{tag}&subject=t{tag}"
    for sub in ("site1", "site2"):
        assert open_tracked(opened, url, SPEC, sub=sub).write_changes(*batch(src, 0, 1))
    ids = [msg_id for msg_id, _ in nats_raw_messages(nats_url, f"S{tag}")]
    assert ids == ["site1:1-0-upsert", "site2:1-0-upsert"]


def test_nats_ids_differ_between_registrations_of_a_subscription_name(
    nats_url: str, opened: list[Sink]
) -> None:
    """QA: ids were SUBSCRIPTION:cid-seq-op, and JetStream de-duplicates per stream for 2
    minutes: a subscription re-created under its name within that window (here on another
    source, whose cids are the same) had its messages dropped as duplicates of the old
    one's. A retry within one registration keeps its ids, and is dropped."""
    tag = uuid.uuid4().hex[:10]
    url = f"{nats_url}?stream=S{tag}&subject=t{tag}"
    sources = {"r1": SourceSim(SPEC), "r2": SourceSim(SPEC)}
    for registration, src in sources.items():
        src.commit(("upsert", {**sample_row(1), "name": registration}))

    def publish(registration: str) -> None:
        sink = open_tracked(opened, url, SPEC, sub="reused")
        sink.registration = registration
        sink.forget_progress()  # as the server does when the subscription registers
        src = sources[registration]
        sink.write_snapshot(src.chunk(0, 100, 1))
        assert sink.write_changes(*batch(src, 0, 1, sub="reused")) is True

    publish("r1")
    publish("r2")
    publish("r2")  # a crash before the progress was recorded: all of it again
    got = [(msg_id, doc["op"], doc["row"]["name"]) for msg_id, doc in nats_raw_messages(
        nats_url, f"S{tag}")]  # fmt: skip
    snapshot = snapshot_message_id("items", 1, {"id": 1})
    assert got == [
        (f"reused:r1:{snapshot}", "snapshot", "r1"),
        ("reused:r1:1-0-upsert", "upsert", "r1"),
        (f"reused:r2:{snapshot}", "snapshot", "r2"),
        ("reused:r2:1-0-upsert", "upsert", "r2"),
    ]


def test_webhook_retries_5xx_and_refuses_4xx(opened: list[Sink]) -> None:
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 4)])
    with WebhookReceiver() as receiver:
        sink = open_tracked(opened, receiver.url, SPEC)
        assert isinstance(sink, WebhookSink)
        sink.sleep = lambda _seconds: None
        receiver.fail_next(2, 503)
        assert sink.write_changes(*batch(src, 0, 1)) is True
        ids = [r.header("webhook-id") for r in receiver.requests]
        assert len(ids) == 3 and len(set(ids)) == 1  # the same id on every retry
        assert webhook_messages(receiver) == expected_messages(src, 0, 1)
        receiver.fail_next(1, 400)
        src.commit(("delete", (1,)))
        with pytest.raises(SinkError, match="HTTP 400"):
            sink.write_changes(*batch(src, 1, 2))
        assert sink.applied_cid() == 1


def test_webhook_signs_with_the_secret(opened: list[Sink]) -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    with WebhookReceiver() as receiver:
        sink = open_tracked(opened, f"{receiver.url}?litecdc_secret={secret}", SPEC)
        assert sink.write_changes(*batch(src, 0, 1)) is True
        assert [verify_standard_webhook(secret, r.headers, r.body) for r in receiver.requests] == [
            True
        ]


@pytest.mark.parametrize("kind", ["rabbitmq", "webhook"])
def test_message_ids_differ_between_registrations_of_a_subscription_name(
    kind: str, request: pytest.FixtureRequest, opened: list[Sink]
) -> None:
    """QA: RabbitMQ's message_id was cid-seq-op, the webhook's ids SUBSCRIPTION-… and
    cid-seq-op: a subscription re-created under its name (here on another source with the
    same history, so the same cids) sent the old one's ids again, and a consumer
    de-duplicating on them dropped its rows as ones it had. Now both are scoped as NATS's
    (SUBSCRIPTION:REGISTRATION:ID), and a retry within one registration keeps its ids."""
    sources = {"r1": SourceSim(SPEC), "r2": SourceSim(SPEC)}
    for registration, src in sources.items():
        src.commit(("upsert", {**sample_row(1), "name": registration}))
    with contextlib.ExitStack() as stack:
        if kind == "rabbitmq":
            base, queue = request.getfixturevalue("rabbitmq_url"), f"q{uuid.uuid4().hex[:10]}"
            url = f"{base}?queue={queue}"
        else:
            receiver = stack.enter_context(WebhookReceiver())
            url = receiver.url
        for registration in ("r1", "r2", "r2"):  # r2 again: a crash, all of it again
            sink = open_tracked(opened, url, SPEC, sub="reused")
            sink.registration = registration
            src = sources[registration]
            sink.write_snapshot(src.chunk(0, 100, 1))
            assert sink.write_changes(*batch(src, 0, 1, sub="reused")) is True
        if kind == "rabbitmq":
            sent = rabbitmq_messages(base, queue)
        else:
            sent = webhook_raw_messages(receiver)
            webhook_ids = [r.header("webhook-id") for r in receiver.requests]
    snapshot = snapshot_message_id(SPEC.name, 1, {"id": 1})
    rounds = ("r1", "r2", "r2")
    assert [(i, doc["op"], doc["row"]["name"]) for i, doc in sent] == [
        (f"reused:{r}:{msg_id}", op, r)
        for r in rounds
        for msg_id, op in ((snapshot, "snapshot"), ("1-0-upsert", "upsert"))
    ]
    if kind == "webhook":  # the batches' ids: a snapshot chunk's, a change batch's
        assert webhook_ids == [
            f"reused:{r}:{batch_id}" for r in rounds for batch_id in (f"{snapshot}-1", "0-1-1")
        ]


def test_rabbitmq_message_id_of_a_subscription_with_a_long_name_fits_amqp(
    rabbitmq_url: str, opened: list[Sink]
) -> None:
    """AMQP's message_id holds 255 bytes: scoped by a name of 200 characters (the most a
    subscription's has), a snapshot row's id at a large cid passed it and pika refused
    every publish (ShortStringTooLong). A name over 100 characters is cut, a hash of it
    kept: two names alike in their first 100 characters still get ids of their own."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    cid = 2**62
    snapshot = pa.Table.from_pylist([{**sample_row(1), CID_COLUMN: cid}], schema=SPEC.row_schema())
    change = {CID_COLUMN: cid, SEQ_COLUMN: 0, OP_COLUMN: "upsert", **sample_row(1)}
    events = pa.Table.from_pylist([change], schema=SPEC.change_schema())
    for sub in ("s" * 200, "s" * 199 + "t"):
        sink = open_tracked(opened, f"{rabbitmq_url}?queue={queue}", SPEC, sub=sub)
        sink.registration = "5d41402abc4b"
        sink.write_snapshot(snapshot)
        assert sink.write_changes(events, ChangeBatch(sub, 0, cid)) is True
    ids = [msg_id for msg_id, _ in rabbitmq_messages(rabbitmq_url, queue)]
    assert len(ids) == len(set(ids)) == 4
    assert all(len(i) <= 255 and i.startswith("s" * 100 + "~") for i in ids), ids
    assert ids[1].endswith(f":5d41402abc4b:{message_id(cid, 0, 'upsert')}")


# -- the webhook against receivers that misbehave ----------------------------------------

Answer = Iterator[bytes | float]  # bytes to send, or seconds to wait first


class ScriptedReceiver:
    """A real HTTP/1.1 server on 127.0.0.1 whose answers a test writes byte by byte.

    It reads each request whole (head, then a Content-Length body), records it, and sends
    what ``answer(body)`` yields — bytes, or seconds to wait before the next (a trickle);
    then it closes the connection. Leaving the ``with`` block ends every answer.
    """

    def __init__(self, answer: Callable[[bytes], Answer]) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/hook"
        self.bodies: list[bytes] = []
        self._stopping = threading.Event()
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> ScriptedReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._listener.close()
        for conn in self._connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            length = int(found.group(1)) if found else 0
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            self.bodies.append(body)
            for piece in self._answer(body):
                if isinstance(piece, float):
                    if self._stopping.wait(piece):
                        return
                else:
                    conn.sendall(piece)


def bounded(call: Callable[[], object], release: Callable[[], None]) -> object:
    """What ``call()`` returned or raised. A call still running after 60 s — a wait the
    sink's own deadline should have ended — fails the test (``release()`` then ends it: a
    receiver holding it)."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # the caller looks at it
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        release()
        thread.join(60)
        pytest.fail("still running after 60 s")
    return outcome[0]


def test_webhook_timeout_bounds_the_whole_request(opened: list[Sink]) -> None:
    """QA (as in the CDC service's sink): httpx's timeouts bound each network operation,
    so a receiver trickling its answer a byte at a time held a request for its whole
    length — here 4 KiB at 0.1 s a byte, 7 minutes with litecdc_timeout=1. Now the
    request ends at litecdc_timeout: a trickled status line and headers are a timeout
    (retried), a trickled body after a 2xx is a delivered batch (the status says so)."""
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    src.commit(("upsert", sample_row(2)))

    def trickled_head(_body: bytes) -> Answer:
        for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 4096:
            yield bytes([byte])
            yield 0.1

    with ScriptedReceiver(trickled_head) as slow_head:
        url = f"{slow_head.url}?litecdc_timeout=1&litecdc_retries=2"
        sink = open_tracked(opened, url, SPEC)
        assert isinstance(sink, WebhookSink)
        sink.sleep = lambda _seconds: None
        error = bounded(lambda: sink.write_changes(*batch(src, 0, 1)), slow_head.__exit__)
    assert isinstance(error, SinkError), error
    assert "after 2 attempt(s) (timed out: no complete answer within litecdc_timeout (1s))" in (
        str(error)
    )
    assert len(slow_head.bodies) == 2

    with WebhookReceiver() as slow_body:
        slow_body.trickle_seconds = 0.1  # status and headers at once, then 4 KiB
        sink = open_tracked(opened, f"{slow_body.url}?litecdc_timeout=1", SPEC)

        def release() -> None:
            slow_body.trickle_seconds = 0

        applied = bounded(lambda: sink.write_changes(*batch(src, 0, 2)), release)
        assert applied is True
        assert len(slow_body.requests) == 1


def test_webhook_reads_no_more_of_an_answer_than_it_needs(opened: list[Sink]) -> None:
    """QA: the sink read every answer's body whole, into memory: a receiver answering 200
    with an endless body (quickly enough that no read timed out) held the batch for
    ever, its memory growing. The status says the batch is taken: at most 64 KiB of the
    body is read."""

    def endless(_body: bytes) -> Answer:
        yield b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        while True:
            yield b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
            yield 0.05

    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    with ScriptedReceiver(endless) as receiver:
        sink = open_tracked(opened, f"{receiver.url}?litecdc_timeout=60", SPEC)
        applied = bounded(lambda: sink.write_changes(*batch(src, 0, 1)), receiver.__exit__)
    assert applied is True  # taken at the status, not at the 60 s deadline
    assert len(receiver.bodies) == 1


@pytest.mark.parametrize(
    "location",
    [
        "https://hooks.example/v2/orders?token=t0ken",
        # httpx parses a redirect's Location even when it does not follow it: this one
        # raised idna's IDNAError, no httpx error, out of the sink and its retries
        "http://xn--zz/hook",
    ],
)
def test_webhook_redirect_is_refused_at_once_naming_where_it_leads(
    location: str, opened: list[Sink]
) -> None:
    """QA: a 3xx was retried as if the endpoint were down, then reported as 'cannot
    deliver … (HTTP 308): check the endpoint is up'. Redirects are not followed (the
    batch and its signature would go elsewhere): the error names the new address."""

    def redirect(_body: bytes) -> Answer:
        yield (
            f"HTTP/1.1 308 Permanent Redirect\r\nLocation: {location}\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n"
        ).encode()

    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    with ScriptedReceiver(redirect) as receiver:
        sink = open_tracked(opened, f"{receiver.url}?litecdc_retries=3", SPEC)
        assert isinstance(sink, WebhookSink)
        sink.sleep = lambda _seconds: None
        with pytest.raises(SinkError) as info:
            sink.write_changes(*batch(src, 0, 1))
    assert len(receiver.bodies) == 1
    assert f"answered HTTP 308, a redirect to {mask_url(location)}: " in str(info.value)
    assert "give the sink the URL the endpoint redirects to" in str(info.value)
    assert "t0ken" not in str(info.value)


def test_webhook_answer_that_is_not_http_is_retried_then_a_sink_error(
    opened: list[Sink],
) -> None:
    def garbage(_body: bytes) -> Answer:
        yield b"this is not http\r\n\r\n"

    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    with ScriptedReceiver(garbage) as receiver:
        sink = open_tracked(opened, f"{receiver.url}?litecdc_retries=2", SPEC)
        assert isinstance(sink, WebhookSink)
        sink.sleep = lambda _seconds: None
        with pytest.raises(SinkError, match=r"after 2 attempt.*RemoteProtocolError: illegal"):
            sink.write_changes(*batch(src, 0, 1))
    assert len(receiver.bodies) == 2


def test_webhook_splits_a_batch_a_receiver_would_refuse_as_too_large(
    opened: list[Sink],
) -> None:
    """QA: a batch went as one body of up to 10,000 events, several MB; a receiver behind
    nginx (client_max_body_size 1m by default) refused it with 413, a SinkError on every
    retry of the subscription, for ever. Bodies are now at most 1,000,000 bytes."""
    limit = 1024 * 1024

    def nginx_like(body: bytes) -> Answer:
        status = b"413 Request Entity Too Large" if len(body) > limit else b"200 OK"
        yield b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

    src = SourceSim(SPEC)
    rows = [{**sample_row(i), "name": f"{i:04}" * 250, "data": None} for i in range(1, 3001)]
    src.commit(*[("upsert", row) for row in rows])
    with ScriptedReceiver(nginx_like) as receiver:
        sink = open_tracked(opened, receiver.url, SPEC)
        assert sink.write_changes(*batch(src, 0, 1)) is True
    docs = [json.loads(body) for body in receiver.bodies]
    assert len(docs) > 3 and all(len(body) <= 1_000_000 for body in receiver.bodies)
    assert [(d["part"], d["parts"]) for d in docs] == [
        (n, len(docs)) for n in range(1, len(docs) + 1)
    ]
    events = [event for d in docs for event in d["events"]]
    assert [e["key"]["id"] for e in events] == list(range(1, 3001))


def test_webhook_credentials_reach_the_endpoint_but_no_log_or_error(
    opened: list[Sink], caplog: pytest.LogCaptureFixture
) -> None:
    """QA (as in the CDC service's sink): httpx logs each request's URL, credentials
    included (``HTTP Request: POST http://app:s3cret@…``). They are sent as basic auth
    now, outside the URL; errors and warnings show the URL masked."""
    caplog.set_level(logging.DEBUG)
    secret = "whsec_" + base64.b64encode(b"k" * 24).decode()
    src = SourceSim(SPEC)
    src.commit(("upsert", sample_row(1)))
    src.commit(("delete", (1,)))
    with WebhookReceiver() as receiver:
        url = receiver.url.replace("//", "//app:s3cret@", 1)
        sink = open_tracked(opened, f"{url}?token=t0ken&litecdc_secret={secret}", SPEC)
        assert isinstance(sink, WebhookSink)
        sink.sleep = lambda _seconds: None
        receiver.fail_next(1, 503)  # a retry: a warning naming the URL
        assert sink.write_changes(*batch(src, 0, 1)) is True
        assert receiver.requests[-1].header("authorization") == (
            "Basic " + base64.b64encode(b"app:s3cret").decode()
        )
        assert receiver.requests[-1].path == "/hook?token=t0ken"
        assert verify_standard_webhook(
            secret, receiver.requests[-1].headers, receiver.requests[-1].body
        )
        receiver.fail_next(1, 401)
        with pytest.raises(SinkError) as refused:
            sink.write_changes(*batch(src, 1, 2))
    with pytest.raises(SinkError) as unreachable:  # the receiver is gone
        sink.write_changes(*batch(src, 1, 2))
    assert "HTTP Request: POST" in caplog.text  # (httpx's lines were captured)
    assert "retry 1/4" in caplog.text
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("litecdc"))
    assert "app:***@" in ours and "t0ken" not in ours
    for text in (caplog.text, str(refused.value), str(unreachable.value)):
        assert "s3cret" not in text
        assert "whsec_" not in text
    for text in (str(refused.value), str(unreachable.value)):
        assert "app:***@" in text and "t0ken" not in text


# -- URLs and unreachable servers -------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cret@127.0.0.1:{port}/db",
        "mysql://app:s3cret@127.0.0.1:{port}/db",
        "nats://app:s3cret@127.0.0.1:{port}",
        "amqp://app:s3cret@127.0.0.1:{port}/",
        "http://127.0.0.1:{port}/hook?litecdc_retries=1",
    ],
)
def test_unreachable_server_is_a_clear_sink_error(url: str) -> None:
    url = url.format(port=closed_port())
    with pytest.raises(SinkError) as info:
        sink = open_sink(url, SPEC, "sub")  # a webhook is first contacted by a write
        try:
            sink.write_changes(SourceSim(SPEC).events(0, 0), ChangeBatch("sub", 0, 1))
        finally:
            sink.close()
    message = str(info.value)
    assert "s3cret" not in message
    assert "127.0.0.1" in message


def test_rabbitmq_unreachable_broker_says_where_and_what_to_check() -> None:
    """QA: an unreachable broker was reported as 'AMQPConnectionError' and nothing else; a
    port that accepts but never answers raised pika's own AMQPConnectorStackTimeout."""
    port = closed_port()
    with pytest.raises(SinkError) as info:
        open_sink(f"amqp://app:s3cret@127.0.0.1:{port}/", SPEC, "sub")
    message = str(info.value)
    assert f"cannot reach the broker at 127.0.0.1:{port} (amqp://app:***@127.0.0.1:{port}/)" in (
        message
    )
    assert (
        f"connection refused: check that RabbitMQ is running and listens on 127.0.0.1:{port}"
        in (message)
    )
    assert "AMQPConnection" not in message and "s3cret" not in message

    with socket.socket() as silent:  # takes the connection, never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        with pytest.raises(SinkError) as info:
            open_sink(f"amqp://app:s3cret@127.0.0.1:{port}/?connect_timeout=1", SPEC, "sub")
    message = str(info.value)
    assert f"the broker at 127.0.0.1:{port} did not answer (AMQP) within 1 s" in message
    assert "check that the port is RabbitMQ's AMQP port" in message and "s3cret" not in message


def test_rabbitmq_other_protocol_on_the_port_is_named() -> None:
    """QA: a server of another protocol (HTTP here) that answers AMQP's greeting and hangs
    up was reported as StreamLostError with 'check the URL's credentials'."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer_as_http() -> None:
            conn, _ = listener.accept()
            with conn, contextlib.suppress(OSError):
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        server = threading.Thread(target=answer_as_http, daemon=True)
        server.start()
        with pytest.raises(SinkError) as info:
            open_sink(f"amqp://app:s3cret@127.0.0.1:{port}/", SPEC, "sub")
        server.join(10)
    message = str(info.value)
    assert (
        f"the server at 127.0.0.1:{port} closed the connection during the AMQP handshake" in message
    )
    assert "check that the port is RabbitMQ's AMQP port" in message
    assert "a TLS listener needs amqps://" in message
    assert "credentials" not in message and "s3cret" not in message


def test_rabbitmq_refused_login_or_vhost_is_named(rabbitmq_url: str) -> None:
    where = urlsplit(rabbitmq_url).netloc.rpartition("@")[2]
    with pytest.raises(SinkError) as info:
        open_sink(f"amqp://guest:wrong@{where}/", SPEC, "sub")
    message = str(info.value)
    assert f"the broker at {where} refused the login of user 'guest'" in message
    assert "check the URL's user and password" in message and "wrong" not in message
    with pytest.raises(SinkError) as info:
        open_sink(f"amqp://guest:guest@{where}/nosuchvhost", SPEC, "sub")
    assert f"the broker at {where} refused access to virtual host 'nosuchvhost'" in str(info.value)


def test_rabbitmq_unknown_host_or_failed_tls_handshake_is_named(tmp_path: Path) -> None:
    """The connection workflow's other failures, said in terms of the URL (as pika's
    blocking client had them): a host name with no address, and amqps:// to a broker whose
    certificate the system does not trust."""
    with pytest.raises(SinkError) as info:
        open_sink("amqp://app:s3cret@nosuch.invalid/", SPEC, "sub")
    message = str(info.value)
    assert "cannot reach the broker at nosuch.invalid:5672" in message
    assert "check the URL's host name (no address found for 'nosuch.invalid')" in message
    assert "s3cret" not in message

    context = server_ssl_context(make_certs(tmp_path / "certs"))  # a CA of its own
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def handshake() -> None:  # once: the client refuses the certificate
            conn, _ = listener.accept()
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                pass
            conn.close()

        server = threading.Thread(target=handshake, daemon=True)
        server.start()
        with pytest.raises(SinkError) as info:
            open_sink(f"amqps://app:s3cret@127.0.0.1:{port}/", SPEC, "sub")
        server.join(10)
    message = str(info.value)
    assert f"the TLS handshake with the broker at 127.0.0.1:{port} failed" in message
    assert "certificate verify failed" in message
    assert "check the broker's certificate" in message and "s3cret" not in message


@pytest.mark.parametrize(
    ("kind", "names_the_user"),
    [
        ("postgresql", 'role "litecdcsame" does not exist'),
        ("mariadb", "Access denied for user 'litecdcsame'@"),
        ("rabbitmq", "refused the login of user 'litecdcsame'"),
    ],
)
def test_password_mask_spares_a_user_named_like_the_password(
    request: pytest.FixtureRequest, kind: str, names_the_user: str
) -> None:
    """QA: with the user named like the password (amqp://guest:guest@…) the scrubber masked
    the user name too: "Access denied for user '***'@…", 'role "***" does not exist'."""
    base = urlsplit(request.getfixturevalue(f"{kind}_url"))
    where = base.netloc.rpartition("@")[2]
    url = urlunsplit(base._replace(netloc=f"litecdcsame:litecdcsame@{where}"))
    with pytest.raises(SinkError) as info:
        open_sink(url, SPEC, "sub")
    message = str(info.value)
    assert names_the_user in message, message
    assert "litecdcsame:***@" in message and "litecdcsame:litecdcsame" not in message


def test_scrub_password_masks_the_password_only() -> None:
    assert scrub_password("amqp://guest:guest@h:5672/ user 'guest'", "guest", "guest") == (
        "amqp://guest:***@h:5672/ user 'guest'"
    )
    assert scrub_password("auth with s3cret failed for app", "s3cret", "app") == (
        "auth with *** failed for app"
    )
    assert scrub_password("p%40ss or p@ss", "p@ss", "u") == "*** or ***"
    assert scrub_password("user admin, password adm", "adm", "admin") == (
        "user admin, password ***"
    )
    assert scrub_password("x://adminx:admin@h", "admin", "adminx") == "x://adminx:***@h"


def test_delta_path_that_cannot_hold_a_table(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(SinkError, match="delta sink"):
        open_sink(f"delta:{tmp_path}/file/table", SPEC, "sub")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("orders", "no scheme"),
        ("ftp://host/x", "unknown scheme 'ftp'"),
        ("delta:relative/path", "absolute path"),
        ("delta://host/abs", "local path"),
        ("delta:/abs?x=1", "no query parameters"),
        # delta-rs decodes %XX in a local path: the table would go to /lake/aA
        ("delta:/lake/a%2541", "contains '%'"),
        ("postgresql://u:pw@127.0.0.1:5432", "database name"),
        ("postgresql://u:pw@127.0.0.1:5432/db?tabel=x", "unknown query parameter 'tabel'"),
        ("postgresql://u:pw@127.0.0.1:99999/db", "port"),
        ("postgresql://u:pw@127.0.0.1/db?sslmode=maybe", "sslmode"),
        ("postgresql://u:pw@/db", "missing host"),
        ("mysql://u@127.0.0.1/db?schema=x", "unknown query parameter 'schema'"),
        ("mariadb://u@127.0.0.1/db?table=", "is empty"),
        ("nats://127.0.0.1:4222?stream=a.b", "stream"),
        ("nats://127.0.0.1:4222?subject=a.*", "subject"),
        ("amqp://u:pw@127.0.0.1/?exchange=e&queue=q", "not both"),
        ("http://127.0.0.1/hook?litecdc_retries=0", "litecdc_retries"),
        ("http://127.0.0.1/hook?litecdc_secret=short", "litecdc_secret"),
        ("https://127.0.0.1/hook?litecdc_bogus=1", "unknown query parameter"),
        # what httpx refuses to send to (it raised at every attempt, no httpx error)
        ("http://xn--zz/hook", "Invalid A-label"),
        ("http://u:pw@127.0.0.1/ho\x00ok", "non-printable ASCII character"),
        # names httpx takes but cannot connect to: it failed at every attempt (QA)
        ("http://u:pw@a..b/hook", "invalid host 'a..b': a label (the text between dots) is"),
        (f"http://{'a' * 64}.example/hook", "longer than 63 characters"),
        (f"http://x.{'a' * 64}/hook", "longer than 63 characters"),
        (f"http://{'.'.join(['a' * 60] * 5)}/hook", "the name is 304 characters long"),
        # AMQP short strings (review): pika refused them at every run
        (f"amqp://u:pw@127.0.0.1/?exchange={'e' * 256}", "exchange name is longer than AMQP's"),
        (f"amqp://u:pw@127.0.0.1/{'v' * 256}?queue=q", "vhost name is longer than AMQP's 255"),
    ],
)
def test_bad_sink_url_is_refused_without_connecting(url: str, problem: str) -> None:
    with pytest.raises(SinkError) as info:
        parse_sink_url(url)
    assert problem in str(info.value)
    assert ":pw@" not in str(info.value)


def test_sink_urls_parse_with_defaults() -> None:
    assert parse_sink_url("delta:/data/lake/orders") == DeltaOptions("/data/lake/orders")
    assert parse_sink_url("delta:///data/lake/orders/") == DeltaOptions("/data/lake/orders")
    pg = parse_sink_url("postgresql://app:p%40ss@db.example:6543/shop?table=o&schema=s")
    assert isinstance(pg, SqlOptions)
    assert (pg.dialect, pg.host, pg.port, pg.user, pg.password) == (
        "postgresql",
        "db.example",
        6543,
        "app",
        "p@ss",
    )
    assert (pg.database, pg.table, pg.schema) == ("shop", "o", "s")
    my = parse_sink_url("mariadb://root@127.0.0.1/shop")
    assert isinstance(my, SqlOptions)
    assert (my.dialect, my.port, my.table, my.password) == ("mysql", 3306, None, None)
    hook = parse_sink_url("https://h.example/in?k=v&litecdc_timeout=2.5")
    assert isinstance(hook, WebhookOptions)
    assert (hook.url, hook.timeout) == ("https://h.example/in?k=v", 2.5)
    assert "pw" not in repr(parse_sink_url("amqp://u:pw@h/"))


def test_mask_url_hides_passwords_and_secrets() -> None:
    assert mask_url("postgresql://app:s3cret@h:5432/db?table=t") == (
        "postgresql://app:***@h:5432/db?table=t"
    )
    assert "whsec" not in mask_url("https://h/x?litecdc_secret=whsec_abc&a=1")
    assert mask_url("nats://h:4222") == "nats://h:4222"


def test_delta_refuses_a_table_another_subscription_or_table_wrote(
    tmp_path: Path, opened: list[Sink]
) -> None:
    """QA: the Delta sink took any existing Delta table at its path: a second subscription
    (of another table) into the same directory added its columns to the first's table and
    mixed their rows."""
    url = f"delta:{tmp_path}/x"
    src = SourceSim(SPEC)
    src.commit(*[("upsert", sample_row(i)) for i in range(1, 4)])
    sink = open_tracked(opened, url, SPEC, sub="a2")
    assert sink.write_changes(*batch(src, 0, src.cid, sub="a2")) is True
    with pytest.raises(
        SchemaMismatchError,
        match=r"mirror of table 'items' \(key id\) for subscription 'a2', not of table 'regions'",
    ):
        open_sink(url, COMPOSITE_SPEC, "b")  # another table
    with pytest.raises(SchemaMismatchError, match="give each subscription its own path"):
        open_sink(url, SPEC, "b")  # the same table, for another subscription
    with pytest.raises(
        SchemaMismatchError, match=r"for subscription 'a2', not of table 'items' \(key id, name\)"
    ):
        open_sink(url, replace(SPEC, key=("id", "name")), "a2")  # the key changed
    mixed = {f.name for f in DeltaTable(str(tmp_path / "x")).schema().fields}
    assert mixed == {*SPEC.column_names, "_litecdc_cid"}  # nothing of theirs was added
    again = open_tracked(opened, url, SPEC, sub="a2")  # its own subscription goes on
    assert again.applied_cid() == src.cid
    assert_mirror(again, src, Mirror("delta", lambda name: name))


def test_delta_table_without_an_owner_record_is_judged_by_its_columns(
    tmp_path: Path, opened: list[Sink]
) -> None:
    """A table made before the owner record (or by another writer) is taken when it has
    no column the source table lacks, and then recorded as this subscription's."""
    rows = SourceSim(COMPOSITE_SPEC)
    rows.commit(("upsert", {"region": "eu", "n": 1, "value": "v"}))
    write_deltalake(str(tmp_path / "other"), rows.chunk("", "\U0010ffff", 1))
    with pytest.raises(SchemaMismatchError, match=r"has column.*'region'.*mirrors another table"):
        open_sink(f"delta:{tmp_path}/other", SPEC, "sub")
    write_deltalake(str(tmp_path / "old"), SourceSim(SPEC).chunk(0, 1, 0))
    open_tracked(opened, f"delta:{tmp_path}/old", SPEC, sub="sub")
    with pytest.raises(SchemaMismatchError, match="for subscription 'sub', not of"):
        open_sink(f"delta:{tmp_path}/old", SPEC, "another")
    # refused for a column's type: not recorded as the refused subscription's (types QA:
    # the next subscription to that path was refused as not its owner)
    empty = SourceSim(SPEC).chunk(0, 1, 0)
    where = empty.schema.get_field_index("n")
    doubled = empty.set_column(where, "n", pa.array([], pa.float64()))
    write_deltalake(str(tmp_path / "typed"), doubled)
    with pytest.raises(SchemaMismatchError, match=r"column 'n' of .* the source has int64"):
        open_sink(f"delta:{tmp_path}/typed", SPEC, "first")
    assert not DeltaTable(str(tmp_path / "typed")).metadata().description
    with pytest.raises(SchemaMismatchError, match=r"column 'n' of .* the source has int64"):
        open_sink(f"delta:{tmp_path}/typed", SPEC, "second")  # the same reason, not an owner


def test_delta_read_rows_does_not_create_a_missing_table(tmp_path: Path) -> None:
    """`pipeline verify` reads a mirror: before any run there is none, and it says so
    instead of creating an empty one."""
    path = tmp_path / "never-written"
    sink = open_sink(f"delta:{path}", SPEC, "verify-only", prepare=False)
    with pytest.raises(SinkError, match="no Delta table"):
        sink.read_rows()
    assert not path.exists()
