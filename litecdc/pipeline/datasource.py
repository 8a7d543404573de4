"""The ``litecdc`` PySpark data source: snapshot reads and change streams from a node.

Spark's Python workers must import litecdc: start the session with
``litecdc.pipeline.spark.spark_session()`` (it points PYSPARK_PYTHON at this interpreter
and registers the source), or set PYSPARK_PYTHON to an interpreter that has litecdc
before creating your own session, then call ``register(spark)`` as below.

Snapshot (batch) read: partitions are key ranges of the table (``/splits``), read in
parallel; each partition pages through its range by last key, every page one SQLite
read transaction at the cid stored in ``_litecdc_cid``::

    from litecdc.pipeline.datasource import register

    register(spark)
    df = (
        spark.read.format("litecdc")
        .option("url", "http://127.0.0.1:4001")
        .option("table", "orders")
        .option("partitions", 4)
        .load()
    )
    print(df.count())

Change stream: offsets are cids (``{"cid": N}``); a micro-batch holds the events of
whole transactions after the previous offset, at most about ``max_events`` of them, in
one partition; with ``subscription`` set, each committed batch moves that
subscription's retention hold on the node forward::

    from litecdc.pipeline.datasource import register

    register(spark)
    query = (
        spark.readStream.format("litecdc")
        .option("url", "http://127.0.0.1:4001")
        .option("table", "orders")
        .option("mode", "changes")
        .option("subscription", "orders-example")
        .option("max_events", 100000)
        .load()
        .writeStream.format("memory")
        .queryName("orders_changes")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.sql("SELECT * FROM orders_changes ORDER BY _litecdc_cid, _litecdc_seq").show()

Options (all strings, as Spark passes them; any other is an error):

==============  ==========================================================================
url             node address(es), comma-separated; the next one is tried on connection
                errors (required)
table           the source table (required)
mode            ``snapshot`` (default: rows, ``TableSpec.row_schema()``) or ``changes``
                (events, ``TableSpec.change_schema()``); a stream needs ``changes``
partitions      key ranges of a snapshot read, read in parallel (default 2)
page_rows       rows (or events) asked of the node per request (default 200000)
ranges          JSON list of ``[after_key, until_key, max_rows]``: read exactly these
                chunks, one partition each, instead of ``partitions`` (resumable snapshots)
min_cid         snapshot read: every page read at this cid or later (a node behind it
                waits, then the next listed node is asked); the pipeline gives the
                subscription's registration
after_cid       ``changes`` batch read: events after this cid (default 0)
until_cid       ``changes`` batch read: up to this cid, greater than after_cid (default:
                the node's head when the read is planned; no events after after_cid
                yet make an empty DataFrame)
starting_cid    stream: ``latest`` (default) or a cid to start after (not beyond the
                node's head); with ``subscription``, ``latest`` means the
                subscription's hold (the subscription is registered first when the
                node does not know it; an expired hold is an error, not a silent
                restart at the head); with a cid, the subscription's hold is placed at
                that cid (unless it is behind it already), so the node keeps what the
                stream is to read
max_events      stream: events per micro-batch, whole transactions (default 100000)
subscription    stream: the subscriber whose hold each commit moves forward
user, password  basic auth, when the node requires it
ca_cert         PEM file of the CA of the node's HTTPS certificate (read on the driver;
                executors get its text)
==============  ==========================================================================
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from litecdc.errors import (
    ConfigError,
    NotFoundError,
    PositionUnavailableError,
    SchemaMismatchError,
    SourceError,
    TableReshapedError,
    UnloggedChangesError,
)
from litecdc.pipeline.tables import OP_COLUMN, TableSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from litecdc.pipeline.source_client import Key, RowsPage, SourceClient

__all__ = [
    "ChangesRange",
    "ChunkRange",
    "KeyRangePartition",
    "LitecdcDataSource",
    "LitecdcOptions",
    "register",
    "spark_schema",
]

log = logging.getLogger("litecdc.pipeline")
T = TypeVar("T")

MODE_SNAPSHOT = "snapshot"
MODE_CHANGES = "changes"
DEFAULT_PARTITIONS = 2
DEFAULT_PAGE_ROWS = 200_000
DEFAULT_MAX_EVENTS = 100_000
#: seconds between micro-batches that carry no event of the table (an idle stream's
#: offset and hold still follow the node's head, without a commit at every trigger)
IDLE_BATCH_INTERVAL = 30.0


def register(spark: SparkSession) -> None:
    """Make ``format("litecdc")`` available in ``spark``."""
    spark.dataSource.register(LitecdcDataSource)


# -- options --------------------------------------------------------------------------

#: every option (this module's docstring says what each does)
OPTIONS = (
    "url", "table", "mode", "partitions", "page_rows", "ranges", "min_cid", "after_cid",
    "until_cid", "starting_cid", "max_events", "subscription", "user", "password", "ca_cert",
)  # fmt: skip


@dataclass(frozen=True)
class ChunkRange:
    """Rows with after_key < key <= until_key (None = unbounded), at most max_rows."""

    after_key: Key | None
    until_key: Key | None
    max_rows: int | None = None


@dataclass(frozen=True)
class LitecdcOptions:
    """The data source's options, parsed and checked once (on the driver)."""

    urls: tuple[str, ...]
    table: str
    mode: str = MODE_SNAPSHOT
    partitions: int = DEFAULT_PARTITIONS
    page_rows: int = DEFAULT_PAGE_ROWS
    ranges: tuple[ChunkRange, ...] | None = None
    after_cid: int = 0
    until_cid: int | None = None
    #: a snapshot's pages are read at this cid or later (its initial version)
    min_cid: int | None = None
    starting_cid: int | None = None  # None: latest
    max_events: int = DEFAULT_MAX_EVENTS
    subscription: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_pem: str | None = field(default=None, repr=False)  # the ca_cert file's text

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> LitecdcOptions:
        from litecdc.pipeline.source_client import parse_urls

        # Spark hands over a case-insensitive dict of strings; a caller may not
        opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
        unknown = sorted(set(opts) - set(OPTIONS))
        if unknown:
            # (QA: a misspelt option — `startingcid`, `partition` — was ignored: the read
            # went on with the default, silently)
            raise ConfigError(
                f"litecdc data source: unknown option(s) {', '.join(map(repr, unknown))}; "
                f"its options are {', '.join(OPTIONS)}"
            )

        url = opts.get("url", "").strip()
        if not url:
            raise ConfigError(
                'litecdc data source: option "url" is required '
                '(the node address, e.g. .option("url", "http://127.0.0.1:4001"))'
            )
        try:
            urls = tuple(parse_urls(url))
        except SourceError as exc:
            raise ConfigError(f'litecdc data source: option "url": {exc}') from exc
        table = opts.get("table", "").strip()
        if not table:
            raise ConfigError(
                'litecdc data source: option "table" is required (the source table to read)'
            )
        mode = opts.get("mode", MODE_SNAPSHOT).strip().lower()
        if mode not in (MODE_SNAPSHOT, MODE_CHANGES):
            raise ConfigError(
                f'litecdc data source: option "mode" must be "snapshot" or "changes", not {mode!r}'
            )
        starting = opts.get("starting_cid", "latest").strip().lower()
        after_cid = _int_option(opts, "after_cid", 0, minimum=0)
        until_cid = (
            _int_option(opts, "until_cid", 0, minimum=0)
            if opts.get("until_cid", "").strip()  # (blank: QA, read as 0 and refused as such)
            else None
        )
        if until_cid is not None and until_cid <= after_cid:
            raise ConfigError(
                f'litecdc data source: option "until_cid" ({until_cid}) must be greater than '
                f'"after_cid" ({after_cid}): a changes read takes the events after after_cid '
                "up to until_cid"
            )
        return cls(
            urls=urls,
            table=table,
            mode=mode,
            partitions=_int_option(opts, "partitions", DEFAULT_PARTITIONS, minimum=1),
            page_rows=_int_option(opts, "page_rows", DEFAULT_PAGE_ROWS, minimum=1),
            ranges=_ranges_option(opts.get("ranges")),
            after_cid=after_cid,
            until_cid=until_cid,
            min_cid=_int_option(opts, "min_cid", 0, minimum=0) or None,
            starting_cid=(
                None if starting == "latest" else _int_option(opts, "starting_cid", 0, minimum=0)
            ),
            max_events=_int_option(opts, "max_events", DEFAULT_MAX_EVENTS, minimum=1),
            subscription=opts.get("subscription") or None,
            user=opts.get("user") or None,
            password=opts.get("password") or None,
            ca_pem=_read_ca(opts.get("ca_cert")),
        )

    def client(self) -> SourceClient:
        from litecdc.pipeline.source_client import SourceClient

        return SourceClient(
            list(self.urls), user=self.user, password=self.password, ca_pem=self.ca_pem
        )


def _int_option(opts: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = opts.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(
            f'litecdc data source: option "{name}" must be an integer, not {raw!r}'
        ) from None
    if value < minimum:
        raise ConfigError(f'litecdc data source: option "{name}" must be >= {minimum}')
    return value


def _read_ca(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f'litecdc data source: option "ca_cert": cannot read {path} ({exc})'
        ) from exc


def _ranges_option(raw: str | None) -> tuple[ChunkRange, ...] | None:
    if raw is None or not raw.strip():
        return None
    problem = (
        'litecdc data source: option "ranges" must be a JSON list of '
        "[after_key, until_key, max_rows] (keys: lists of key values or null)"
    )
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ConfigError(problem) from None
    if not isinstance(doc, list):
        raise ConfigError(problem)
    out = []
    for item in doc:
        if not (isinstance(item, list) and len(item) in (2, 3)):
            raise ConfigError(problem)
        after, until = item[0], item[1]
        max_rows = item[2] if len(item) == 3 else None
        if any(k is not None and not isinstance(k, list) for k in (after, until)):
            raise ConfigError(problem)
        if max_rows is not None and (
            not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1
        ):
            raise ConfigError(problem)
        out.append(ChunkRange(after, until, max_rows))
    return tuple(out)


# -- schema ---------------------------------------------------------------------------

_SPARK_TYPES: Mapping[pa.DataType, DataType] = {
    pa.int64(): LongType(),
    pa.float64(): DoubleType(),
    pa.string(): StringType(),
    pa.binary(): BinaryType(),
}


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of a TableSpec's Arrow schema (only the four SQLite types)."""
    fields = []
    for f in schema:
        spark_type = _SPARK_TYPES.get(f.type)
        if spark_type is None:
            raise SourceError(f"column {f.name}: Arrow type {f.type} has no Spark mapping")
        fields.append(StructField(f.name, spark_type, nullable=f.nullable))
    return StructType(fields)


def _output(data: pa.Table, names: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The batches of a page, with exactly Spark's columns in Spark's order (a column
    added at the source since the schema was taken is left out)."""
    missing = [n for n in names if n not in data.schema.names]
    if missing:
        raise SourceError(
            f"source table no longer has column(s) {', '.join(missing)}: restart the read"
        )
    yield from data.select(list(names)).to_batches()


# -- the data source ------------------------------------------------------------------


class LitecdcDataSource(DataSource):
    """``format("litecdc")``: see this module's docstring for examples and options."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = LitecdcOptions.parse(options)
        self._spec: dict[str, Any] | None = None  # TableSpec JSON, fetched once

    @classmethod
    def name(cls) -> str:
        return "litecdc"

    def table_spec(self) -> TableSpec:
        if self._spec is None:
            with self.opts.client() as client:
                try:
                    spec = client.table_spec(self.opts.table)
                except NotFoundError as exc:
                    raise NotFoundError(
                        f"litecdc data source: table {self.opts.table!r} not found ({exc})"
                    ) from exc
            self._spec = spec.to_json()
            return spec
        return TableSpec.from_json(self._spec)

    def schema(self) -> StructType:
        spec = self.table_spec()
        if self.opts.mode == MODE_CHANGES:
            return spark_schema(spec.change_schema())
        return spark_schema(spec.row_schema())

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.opts.mode == MODE_CHANGES:
            return ChangesReader(self.opts, tuple(schema.fieldNames()))
        return SnapshotReader(self.opts, tuple(schema.fieldNames()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # schema() cannot tell a stream from a batch read: the mode option decides
        if OP_COLUMN not in schema.fieldNames():
            return _RefusedStreamReader(
                'litecdc data source: a stream reads change events: add .option("mode", "changes")'
            )
        return StreamReader(self.opts, tuple(schema.fieldNames()))


# -- snapshot -------------------------------------------------------------------------


class KeyRangePartition(InputPartition):
    """Rows with after_key < key <= until_key (None = unbounded), at most max_rows, of
    the table as it was since its reshape at ``reshaped_cid`` (None: not checked)."""

    def __init__(
        self,
        after_key: Key | None,
        until_key: Key | None,
        max_rows: int | None,
        reshaped_cid: int | None = None,
    ) -> None:
        super().__init__((after_key, until_key, max_rows))
        self.after_key = after_key
        self.until_key = until_key
        self.max_rows = max_rows
        self.reshaped_cid = reshaped_cid


class SnapshotReader(DataSourceReader):
    """Key ranges in parallel; each pages through its range by last key."""

    def __init__(self, opts: LitecdcOptions, names: tuple[str, ...]) -> None:
        self.opts = opts
        self.names = names

    def partitions(self) -> Sequence[InputPartition]:
        with self.opts.client() as client:
            # the table's version: its pages are separate reads, and one dropped and
            # created again (or reshaped) while they run must not mix into one snapshot
            reshaped = client.table_info(self.opts.table, min_cid=self.opts.min_cid).reshaped_cid
            if self.opts.ranges is not None:
                return [
                    KeyRangePartition(r.after_key, r.until_key, r.max_rows, reshaped)
                    for r in self.opts.ranges
                ]
            splits = client.splits(self.opts.table, self.opts.partitions, min_cid=self.opts.min_cid)
        return [KeyRangePartition(after, until, None, reshaped) for after, until in splits.ranges()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if _nothing_to_read(partition):
            return
        assert isinstance(partition, KeyRangePartition)
        with self.opts.client() as client:
            yield from read_key_range(
                client,
                self.opts.table,
                partition.after_key,
                partition.until_key,
                partition.max_rows,
                self.opts.page_rows,
                self.names,
                min_cid=self.opts.min_cid,
                reshaped_cid=partition.reshaped_cid,
            )


def read_key_range(
    client: SourceClient,
    table: str,
    after_key: Key | None,
    until_key: Key | None,
    max_rows: int | None,
    page_rows: int,
    names: Sequence[str],
    *,
    min_cid: int | None = None,
    reshaped_cid: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Page through one key range; every page is one read transaction on the node, at
    ``min_cid`` or later (SourceClient.rows). With ``reshaped_cid``, TableReshapedError
    once a page was read after another reshape of the table (QA: a table dropped and
    created again during a read gave rows of both, without an error).

    The next page is fetched while Spark consumes this one (a thread a page ahead): the
    node builds and sends a page while the JVM converts the previous one.
    """

    def pages() -> Iterator[RowsPage]:
        after, remaining = after_key, max_rows
        while remaining is None or remaining > 0:
            limit = page_rows if remaining is None else min(page_rows, remaining)
            page = client.rows(
                table, after_key=after, until_key=until_key, limit=limit, min_cid=min_cid
            )
            if reshaped_cid is not None:
                now = client.table_info(table, min_cid=page.cid).reshaped_cid
                if now != reshaped_cid:
                    raise TableReshapedError(
                        f"table {table} was reshaped at cid {now} (created again, renamed to "
                        "its name, or changed other than by adding a column) while it was "
                        f"being read (its read began at reshape cid {reshaped_cid}): its pages "
                        "would mix two versions of it; read it again"
                    )
            yield page
            if remaining is not None:
                remaining -= page.table.num_rows
            if page.done or page.last_key is None:
                return
            after = page.last_key

    for page in _read_ahead(pages()):
        yield from _output(page.table, names)


_DONE = object()


def _read_ahead(source: Iterator[T]) -> Iterator[T]:
    """``source``'s items, produced one ahead by a thread (errors re-raised here)."""
    ahead: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in source:
                while not stop.is_set():
                    try:
                        ahead.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ahead.put(_DONE)
        except BaseException as exc:  # handed to the consumer
            ahead.put(exc)

    thread = threading.Thread(target=produce, name="litecdc-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = ahead.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


# -- changes --------------------------------------------------------------------------


class ChangesRange(InputPartition):
    """Events with after < cid <= until."""

    def __init__(self, after: int, until: int) -> None:
        super().__init__((after, until))
        self.after = after
        self.until = until


def read_changes(
    client: SourceClient,
    table: str,
    after: int,
    until: int,
    page_events: int,
    names: Sequence[str],
) -> Iterator[pa.RecordBatch]:
    """Events of (after, until] page by page, in (cid, seq) order, with the columns
    ``names``: SchemaMismatchError at a page with a value in another column (one added
    at the source since the read's columns were taken: its values would be lost — QA:
    a running stream left them out), SourceError at a page without one of them."""
    while after < until:
        page = client.changes(table, after=after, until=until, limit=page_events)
        columns = page.table.column_names
        # the node serves today's columns: events from before a column was added have it
        # NULL, so only a value in it is lost by leaving it out
        added = [
            n for n in columns if n not in names and page.table[n].null_count < len(page.table)
        ]
        if added:
            raise SchemaMismatchError(
                f"table {table} gained column(s) {', '.join(added)} after cid {after}, since "
                "this change read took its columns: read again (start the query again) to "
                "have them"
            )
        yield from _output(page.table, names)
        if page.end_cid <= after:
            raise SourceError(
                f"source: changes of {table} after cid {after} did not advance "
                f"(end_cid {page.end_cid}, until {until})"
            )
        after = page.end_cid


def _nothing_to_read(partition: InputPartition) -> bool:
    """Whether ``partition`` is the one PySpark reads when ``partitions()`` returned none
    (``InputPartition(None)``; a batch read always runs at least one task)."""
    return type(partition) is InputPartition and partition.value is None


def _read_changes_range(
    opts: LitecdcOptions, names: Sequence[str], partition: InputPartition
) -> Iterator[pa.RecordBatch]:
    """A ChangesRange partition of a batch read or a stream's micro-batch."""
    if _nothing_to_read(partition):
        return
    assert isinstance(partition, ChangesRange)
    with opts.client() as client:
        yield from read_changes(
            client, opts.table, partition.after, partition.until, opts.page_rows, names
        )


class ChangesReader(DataSourceReader):
    """``mode=changes`` batch read: one partition, after_cid to until_cid."""

    def __init__(self, opts: LitecdcOptions, names: tuple[str, ...]) -> None:
        self.opts = opts
        self.names = names

    def partitions(self) -> Sequence[InputPartition]:
        until = self.opts.until_cid
        with self.opts.client() as client:
            if until is None:  # fixed when planned, so retried tasks read the same events
                until = client.subscriptions().last_cid
                _check_reached(client, self.opts.table, "after_cid", self.opts.after_cid)
            else:
                _check_reached(client, self.opts.table, "until_cid", until)
            if until > self.opts.after_cid:
                # (the first such commit after after_cid: QA, a read across an earlier one
                # passed while a later one was recorded)
                after = self.opts.after_cid
                unlogged = client.position(self.opts.table, after=after, max_events=1).unlogged_cid
                if after < unlogged <= until:
                    raise _unlogged_error(self.opts.table, unlogged, self.opts.after_cid)
        if until <= self.opts.after_cid:
            return []  # nothing after after_cid yet: an empty DataFrame
        return [ChangesRange(self.opts.after_cid, until)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_changes_range(self.opts, self.names, partition)


def _unlogged_error(table: str, unlogged: int, after: int) -> UnloggedChangesError:
    """The refusal of a changes read after ``after`` across commit ``unlogged``, which
    changed the table's rows without change events (the node refuses it too; said before
    a task fails on it)."""
    before = f"read them up to cid {unlogged - 1} at most, then " if after < unlogged - 1 else ""
    return UnloggedChangesError(
        f"litecdc data source: table {table}: commit {unlogged} changed the rows under "
        "this name without change events (the table dropped or renamed, created from a "
        "query or renamed to this name, a column dropped or renamed, or a column with a "
        f"DEFAULT added: the node's journal entry {unlogged} says which): its changes after "
        f"cid {after} cannot bring a copy past it — {before}take a new copy of the table "
        f"(mode=snapshot) and read its changes from there"
    )


def _check_reached(client: SourceClient, table: str, option: str, cid: int) -> None:
    """ConfigError when the node's history does not reach ``cid``, given as ``option``
    (QA: a stream starting after a cid beyond the head skipped every change up to it,
    silently; an until_cid beyond it failed in a task, naming a min_cid never given). A
    cluster node behind the leader is waited for (``min_cid``), as for a read."""
    head = client.subscriptions().last_cid
    if cid <= head:
        return
    try:
        client.position(table, after=head, max_events=1, min_cid=cid)
    except SourceError as exc:
        if "(HTTP 409)" not in str(exc):  # (409: a standalone node's whole history)
            raise
        raise ConfigError(
            f'litecdc data source: option "{option}" ({cid}) is beyond the node\'s head '
            f"(cid {head}): no change has that cid yet — give one the node has reached (a "
            "cid read from another node or database is not this one's)"
        ) from None


class _RefusedStreamReader(DataSourceStreamReader):
    """A stream that fails with ``message`` when first asked anything.

    Raising in ``streamReader()`` itself would do, but PySpark's stream runner then calls
    ``stop()`` on a reader it never got and adds its own UnboundLocalError to the message.
    """

    def __init__(self, message: str) -> None:
        self.message = message

    def _refuse(self) -> ConfigError:
        return ConfigError(self.message)

    def initialOffset(self) -> dict[str, int]:
        raise self._refuse()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        raise self._refuse()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        raise self._refuse()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self._refuse()

    def commit(self, end: dict[str, int]) -> None:
        pass

    def stop(self) -> None:
        pass


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of whole transactions; offsets ``{"cid": N}``."""

    def __init__(self, opts: LitecdcOptions, names: tuple[str, ...]) -> None:
        self.opts = opts
        self.names = names
        self._target: int | None = None  # availableNow: never go past this cid
        self._held: int | None = None  # where this reader last moved the hold to
        self._committed: int | None = None  # the last offset Spark committed
        self._idle_batch_at = 0.0  # when the last batch without events was let through
        self._retention: int | None = None  # the node's retention cap, in cids
        self._reshaped: int | None = None  # the table's reshape cid when the query began
        self._fresh = False  # the query began here (initialOffset), not at its checkpoint
        self._client: SourceClient | None = None

    @property
    def client(self) -> SourceClient:
        # the driver-side reader lives as long as the query: keep one connection pool
        if self._client is None:
            self._client = self.opts.client()
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def initialOffset(self) -> dict[str, int]:
        self._fresh = True  # (Spark asks only a query without offsets in its checkpoint)
        start = self.opts.starting_cid
        if start is not None:
            _check_reached(self.client, self.opts.table, "starting_cid", start)
        name = self.opts.subscription
        if name is None:
            return {"cid": self.client.subscriptions().last_cid if start is None else start}
        sub = self.client.subscriptions().get(name)
        # register (with a starting_cid too: QA, a hold was never placed, and each commit
        # only warned): the node keeps the changes from this cid on for us
        if start is not None:
            # the hold at starting_cid (410 when pruned past): registered at the head, or
            # left past it, it let the node prune the changes this stream is to read
            # (docs QA); an expired one is placed again
            if sub is None or sub.expired or start < sub.cid:
                self.client.register(name, start)
            return {"cid": start}
        if sub is not None and sub.expired:
            # starting over at the head would skip what the node pruned: say so instead
            raise PositionUnavailableError(
                f"litecdc stream: subscription {name!r} fell behind the node's retention cap "
                "and its hold expired: changes it had not read are gone; take a new snapshot "
                "(or delete the subscription on the node to start from its head)"
            )
        return {"cid": sub.cid if sub is not None else self.client.register(name).cid}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_events)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.client.subscriptions().last_cid

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        after = int(start["cid"])
        # Spark asks for the next batch only once the previous one, ending at ``start``,
        # is done; commit(end) comes later still (when the next batch is planned, never
        # for the last batch of an availableNow run): move the hold now
        self._committed = max(self._committed or 0, after)
        self._advance(after)
        if isinstance(limit, ReadMaxRows):
            position = self.client.position(self.opts.table, after=after, max_events=limit.max_rows)
            end_cid = position.end_cid
        else:
            if not isinstance(limit, ReadAllAvailable):
                log.debug("litecdc stream: read limit %r treated as all available", limit)
            position = self.client.position(self.opts.table, after=after, max_events=1)
            end_cid = position.last_cid
        self._check_not_reshaped(position.reshaped_cid, after)
        unlogged = position.unlogged_cid
        if after < unlogged <= end_cid:
            if unlogged - 1 <= after:
                # every change before it is read: this stream's events end here
                raise _unlogged_error(self.opts.table, unlogged, after)
            end_cid = unlogged - 1
        if self._target is not None:
            end_cid = min(end_cid, self._target)
        if position.events == 0 and end_cid > after:
            # nothing for this table: other tables' commits (or the hold moves of
            # this very stream, which are commits too) would make an empty batch at every
            # trigger; let one through now and then so the offset and the hold follow
            now = time.monotonic()
            if now - self._idle_batch_at < IDLE_BATCH_INTERVAL and end_cid - after < (
                self._idle_cids()
            ):
                return {"cid": after}
            self._idle_batch_at = now
        return {"cid": max(end_cid, after)}

    def _check_not_reshaped(self, reshaped: int, after: int) -> None:
        """TableReshapedError once the table was reshaped while this query ran (dropped
        and created again, a column dropped or renamed…): no change event tells of it —
        QA, a running stream went on with the new table's inserts, the old rows kept.
        (Older nodes say 0: not checked.)"""
        if reshaped == 0:
            return
        if self._reshaped is None:
            self._reshaped = reshaped
            if reshaped > after and not self._fresh:
                # a query going on from its checkpoint, whose last run read the table
                # before it was reshaped (a new query may start before a table's creation)
                raise TableReshapedError(
                    f"litecdc stream: table {self.opts.table} was reshaped at cid "
                    f"{reshaped} (created again, renamed to its name, or changed other than "
                    f"by adding a column), after this stream's position (cid {after}) in "
                    "its checkpoint: its events cannot bring what was built from the "
                    "earlier table up to date — take a new copy of the table and stream "
                    "from there (a new checkpoint)"
                )
        elif reshaped != self._reshaped:
            raise TableReshapedError(
                f"litecdc stream: table {self.opts.table} was reshaped at cid {reshaped} "
                "(created again, renamed to its name, or changed other than by adding a "
                f"column) while this stream read its changes (after cid {after}): its events "
                "cannot bring what was built from the earlier table up to date — take a new "
                "copy of the table and stream from there"
            )

    def _idle_cids(self) -> int:
        """How far an idle stream may trail the head before a batch moves its hold: a
        quarter of the node's retention cap (read once), or a busy source expires it
        within IDLE_BATCH_INTERVAL (QA) — and a Parquet log then starts over."""
        if self._retention is None:
            self._retention = self.client.subscriptions().retention_cids
        return max(self._retention // 4, 1)

    def reportLatestOffset(self) -> dict[str, int]:
        return {"cid": self.client.subscriptions().last_cid}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        after, until = int(start["cid"]), int(end["cid"])
        if until <= after:
            return []
        # one partition: events stay in (cid, seq) order within the micro-batch
        return [ChangesRange(after, until)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_changes_range(self.opts, self.names, partition)

    def commit(self, end: dict[str, int]) -> None:
        self._committed = int(end["cid"])
        self._advance(self._committed)

    def _advance(self, cid: int) -> None:
        """Move the subscription's hold to ``cid``: everything up to it is processed.

        Moving a hold is itself a commit on the node; latestOffset keeps an idle stream
        from making a batch (and so a move) at every trigger.
        """
        name = self.opts.subscription
        if name is None or (self._held is not None and cid <= self._held):
            return
        try:
            self.client.progress(name, cid)
        except (NotFoundError, PositionUnavailableError, SourceError) as exc:
            # the batch is already processed; a later call moves the hold further
            log.warning("litecdc stream: could not advance subscription %s: %s", name, exc)
            return
        self._held = cid

    def stop(self) -> None:
        if self._committed is not None:  # leave the hold where the query got to
            self._advance(self._committed)
        if self._client is not None:
            self._client.close()
            self._client = None
