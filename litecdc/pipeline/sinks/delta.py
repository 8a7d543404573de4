"""Delta Lake mirror through delta-rs (the ``deltalake`` package; no JVM).

The table at the path holds the source table's columns plus ``_litecdc_cid``. Every
write is one MERGE on the key columns with the version guard (a row is replaced only
by a higher cid; a delete removes it only if its stored cid is lower).

A change batch is one MERGE (upserts and deletes together, from the net events with
an op column) whose commit carries the Delta app transaction
``(litecdc-<subscription>@<registration>, end_cid)``: ``applied_cid()`` reads it back, and a batch
at or below it is skipped. That record is what stops a replayed older batch from
resurrecting rows a newer batch deleted (the cid guard alone cannot: the row is gone,
so nothing is left to compare against).

A table belongs to one subscription: its description records the subscription, the
source table and its key, and a sink of another subscription or table refuses it (a
table made before that record is taken when it has no column the source lacks).

Not done here: compaction and vacuum. Each commit adds files; run
``DeltaTable(path).optimize.compact()`` and ``vacuum()`` from time to time.

Example::

    sink = DeltaSink("delta:/data/lake/orders", spec, "orders-lake")
    sink.prepare()
    sink.write_changes(events, ChangeBatch("orders-lake", after_cid=0, end_cid=42))
"""

from __future__ import annotations

import json
import logging
from collections.abc import Generator
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import DeltaError

from litecdc.errors import SchemaMismatchError, SinkError
from litecdc.pipeline.events import net_changes
from litecdc.pipeline.sinks.base import (
    READ_BATCH_ROWS,
    ChangeBatch,
    Sink,
    check_case_blind_names,
)
from litecdc.pipeline.sinks.registry import DeltaOptions, parse_sink_url
from litecdc.pipeline.tables import CID_COLUMN, OP_COLUMN, OP_DELETE, OP_UPSERT, TableSpec
from litecdc.wire import unicode_fold

log = logging.getLogger("litecdc.pipeline")

#: Delta primitive type of each Arrow type a TableSpec uses.
DELTA_TYPES = {"int64": "long", "float64": "double", "string": "string", "binary": "binary"}

_ERRORS = (DeltaError, OSError, pa.ArrowException)
#: the key of the owner record in a mirror's description (``DeltaSink._owner``)
OWNER_RECORD = "litecdc_mirror"


def _ident(name: str) -> str:
    """A column name in a delta-rs (DataFusion SQL) predicate: quoted, case kept."""
    return '"' + name.replace('"', '""') + '"'


class DeltaSink(Sink):
    kind = "mirror"

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, DeltaOptions):
            raise SinkError(f"delta sink: {url!r} is not a delta: URL")
        self.path = options.path
        self._table: DeltaTable | None = None

    @property
    def app_id(self) -> str:
        """The Delta app transaction id of this subscription's batch records: per
        registration (``Sink.registration``), so a subscription re-created under an
        earlier one's name — on another source, say — does not skip its batches at or
        below the earlier one's last cid (Delta cannot delete a record)."""
        base = f"litecdc-{self.subscription}"
        return f"{base}@{self.registration}" if self.registration else base

    # -- set-up -----------------------------------------------------------------------

    def check_names(self) -> None:
        check_case_blind_names(
            "delta",
            "Delta",
            str(self.path),
            [*self.spec.column_names, CID_COLUMN],
            unicode_fold,
        )

    def prepare(self) -> None:
        self.check_names()
        try:
            if not DeltaTable.is_deltatable(self.path):
                DeltaTable.create(
                    self.path, self.spec.row_schema(), mode="ignore", description=self._owner()
                )
                log.info("delta sink: created table %s", self.path)
            table = DeltaTable(self.path)  # ours, or one another writer made meanwhile
            self._check_owner(table, adopt=False)
            missing = self._missing_columns(table)
            # recorded as ours only once its columns passed (types QA: a table refused for
            # a column's type kept the refused subscription's record, and refused the next)
            self._check_owner(table, adopt=True)
            if missing:
                table.alter.add_columns(missing)
                log.info("delta sink: added columns %s to %s", [f.name for f in missing], self.path)
        except _ERRORS as exc:
            raise SinkError(f"delta sink: cannot open or create {self.path}: {exc}") from exc
        self._table = table

    def _owner(self) -> str:
        """The record of whose mirror the table is, kept as the table's description
        (delta-rs takes no table property of its own name): the subscription, its source
        table and key."""
        record = {"subscription": self.subscription, "table": self.spec.name}
        return json.dumps({OWNER_RECORD: record | {"key": list(self.spec.key)}})

    def _check_owner(self, table: DeltaTable, *, adopt: bool) -> None:
        """SchemaMismatchError unless the table at the path is this subscription's mirror
        of its table: two subscriptions must never write one table (the second added its
        columns to the first's, and the rows mixed). A table without the record (made by
        an earlier litecdc, or by another writer) is taken when it has no column the
        source table lacks — and, with ``adopt``, gets the record."""
        description = table.metadata().description
        record = _owner_record(description)
        if record is None:
            foreign = [
                f.name
                for f in table.schema().fields
                if f.name not in self.spec.column_names and f.name != CID_COLUMN
            ]
            if foreign:
                raise SchemaMismatchError(
                    f"delta sink: {self.path} has column(s) {', '.join(map(repr, foreign))} "
                    f"that table {self.spec.name!r} does not have: it mirrors another table; "
                    "choose another path (or delete that table to mirror into it anew)"
                )
            if adopt and not description:
                table.alter.set_table_description(self._owner())
                log.info(
                    "delta sink: %s recorded as the mirror of %s", self.path, self.subscription
                )
            return
        theirs = (record.get("subscription"), record.get("table"), list(record.get("key") or ()))
        ours = (self.subscription, self.spec.name, list(self.spec.key))
        if theirs != ours:
            raise SchemaMismatchError(
                f"delta sink: {self.path} is the mirror of table {theirs[1]!r} (key "
                f"{', '.join(map(str, theirs[2]))}) for subscription {theirs[0]!r}, not of "
                f"table {ours[1]!r} (key {', '.join(ours[2])}) for subscription {ours[0]!r}: "
                "give each subscription its own path (or delete that table to mirror into "
                "it anew)"
            )

    def _missing_columns(self, table: DeltaTable) -> list[Field]:
        """The source's columns the table lacks; SchemaMismatchError when one it has is of
        another type, or it has no cid column."""
        existing = {f.name: f for f in table.schema().fields}
        missing: list[Field] = []
        wanted = [*self.spec.columns]
        for column in wanted:
            found = existing.get(column.name)
            expected = DELTA_TYPES[column.arrow]
            if found is None:
                missing.append(Field.from_arrow(pa.field(column.name, column.arrow_type)))
            elif getattr(found.type, "type", None) != expected:
                raise SchemaMismatchError(
                    f"delta sink: column {column.name!r} of {self.path} is {found.type}, the "
                    f"source has {column.arrow} ({expected}): drop or move the table and "
                    "re-subscribe"
                )
        if CID_COLUMN not in existing:
            raise SchemaMismatchError(
                f"delta sink: {self.path} has no {CID_COLUMN} column: it is not a litecdc "
                "mirror; choose another path"
            )
        return missing

    def _dt(self) -> DeltaTable:
        if self._table is None:
            self.prepare()
        assert self._table is not None
        return self._table

    # -- writes -----------------------------------------------------------------------

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        source = _conform(rows, self.spec.row_schema())
        try:
            columns = self._assignments()
            (
                self._merger(source, None)
                .when_matched_update(columns, predicate=f"s.{CID_COLUMN} > t.{CID_COLUMN}")
                .when_not_matched_insert(columns)
                .execute()
            )
        except _ERRORS as exc:
            raise SinkError(f"delta sink: snapshot merge into {self.path} failed: {exc}") from exc

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        self._dt()  # prepared (applied_cid takes the table as it is)
        applied = self.applied_cid()
        if batch.end_cid <= applied:
            log.debug("delta sink: batch up to cid %d already applied", batch.end_cid)
            return False
        if applied > 0 and events.num_rows:
            events = events.filter(pc.greater(events[CID_COLUMN], applied))
        net = net_changes(events, self.spec)
        commit = CommitProperties(app_transactions=[Transaction(self.app_id, batch.end_cid)])
        try:
            table = self._dt()
            before = table.version()
            if net.upserts.num_rows or net.deletes.num_rows:
                source = self._merge_source(net.upserts, net.deletes)
                upsert = f"s.{OP_COLUMN} = '{OP_UPSERT}'"
                columns = self._assignments()
                (
                    self._merger(source, commit)
                    .when_matched_update(
                        columns, predicate=f"{upsert} AND s.{CID_COLUMN} > t.{CID_COLUMN}"
                    )
                    .when_matched_delete(
                        predicate=f"s.{OP_COLUMN} = '{OP_DELETE}' "
                        f"AND t.{CID_COLUMN} < s.{CID_COLUMN}"
                    )
                    .when_not_matched_insert(columns, predicate=upsert)
                    .execute()
                )
            if table.version() == before:
                # delta-rs makes no commit for a merge that changed nothing (every row
                # guarded): record the batch with an empty commit
                write_deltalake(
                    table,
                    self.spec.row_schema().empty_table(),
                    mode="append",
                    commit_properties=commit,
                )
        except _ERRORS as exc:
            raise SinkError(
                f"delta sink: applying changes up to cid {batch.end_cid} to {self.path} "
                f"failed: {exc}"
            ) from exc
        return True

    def _merge_source(self, upserts: pa.Table, deletes: pa.Table) -> pa.Table:
        """Upserts and deletes as one table with an op column (deletes carry NULLs)."""
        schema = self.spec.row_schema()
        columns: dict[str, pa.ChunkedArray] = {}
        for f in schema:
            down = (
                deletes[f.name].cast(f.type)
                if f.name in deletes.column_names
                else pa.chunked_array([pa.nulls(deletes.num_rows, f.type)], f.type)
            )
            columns[f.name] = pa.chunked_array(
                [*upserts[f.name].cast(f.type).chunks, *down.chunks], f.type
            )
        ops = [OP_UPSERT] * upserts.num_rows + [OP_DELETE] * deletes.num_rows
        columns[OP_COLUMN] = pa.array(ops, pa.string())
        fields = [*schema, pa.field(OP_COLUMN, pa.string(), nullable=False)]
        return pa.table(columns, schema=pa.schema(fields))

    def _assignments(self) -> dict[str, str]:
        """Every column of the table set from the source row, names quoted on both sides
        (delta-rs's update_all/insert_all quote them in backticks without escaping: a
        column named with a backtick broke the MERGE)."""
        names = [*self.spec.column_names, CID_COLUMN]
        return {_ident(n): f"s.{_ident(n)}" for n in names}

    def _merger(self, source: pa.Table, commit: CommitProperties | None) -> Any:
        on = " AND ".join(f"t.{_ident(k)} = s.{_ident(k)}" for k in self.spec.key)
        return self._dt().merge(
            source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            commit_properties=commit,
        )

    def disown_rows(self, init_cid: int) -> int:
        try:
            metrics = self._dt().update(
                updates={CID_COLUMN: "0"}, predicate=f"{CID_COLUMN} >= {int(init_cid)}"
            )
        except _ERRORS as exc:
            raise SinkError(
                f"delta sink: taking over the rows of an earlier subscription in {self.path} "
                f"failed: {exc}"
            ) from exc
        return int(metrics.get("num_updated_rows", 0) or 0)

    def finish_snapshot(self, init_cid: int) -> int:
        try:
            metrics = self._dt().delete(f"{CID_COLUMN} < {int(init_cid)}")
        except _ERRORS as exc:
            raise SinkError(f"delta sink: sweeping {self.path} failed: {exc}") from exc
        deleted = int(metrics.get("num_deleted_rows", 0) or 0)
        if deleted:
            log.info("delta sink: removed %d rows the snapshot did not see", deleted)
        return deleted

    # -- reads ------------------------------------------------------------------------

    def applied_cid(self) -> int:
        try:
            if self._table is not None:
                table = self._table
            elif DeltaTable.is_deltatable(self.path):
                # as it is (upgrade QA: verify's reading prepared the table — made it,
                # added columns, recorded an owner — which verify must not do)
                table = DeltaTable(self.path)
            else:
                return 0  # not made yet: nothing applied
            table.update_incremental()  # another process may have committed since
            version = table.transaction_version(self.app_id)
        except _ERRORS as exc:
            raise SinkError(f"delta sink: reading {self.path} failed: {exc}") from exc
        return int(version or 0)

    def read_row_batches(self, batch_rows: int = READ_BATCH_ROWS) -> Generator[pa.Table]:
        if self._table is None and not DeltaTable.is_deltatable(self.path):
            # verify must not create what it checks
            raise SinkError(
                f"delta sink: there is no Delta table at {self.path} yet: has `litecdc "
                "pipeline run` copied this subscription?"
            )
        try:
            # as it is: verify neither adds columns nor records an owner
            table = self._table if self._table is not None else DeltaTable(self.path)
            table.update_incremental()
            self._check_owner(table, adopt=False)
            # The current version's files, read with pyarrow's own local filesystem: going
            # through to_pyarrow_table (delta-rs's filesystem handler) made the process abort
            # at exit more often than not ("terminate called without an active exception",
            # delta-io/delta-rs#2184). The sink's tables are local, written by MERGE/append
            # without deletion vectors; files from before an added column read it as NULL.
            paths = [_local_path(uri) for uri in table.file_uris()]
            files = ds.dataset(paths, format="parquet", schema=self.spec.row_schema())
            # (pyarrow's read-ahead, 16 batches of 4 files, would hold 64 parts at once)
            batches = files.to_batches(
                columns=self.spec.column_names,
                batch_size=batch_rows,
                batch_readahead=1,
                fragment_readahead=1,
            )
            for batch in batches:
                if batch.num_rows:
                    yield pa.Table.from_batches([batch])
        except _ERRORS as exc:
            raise SinkError(f"delta sink: reading {self.path} failed: {exc}") from exc

    def close(self) -> None:
        self._table = None


def _owner_record(description: str | None) -> dict[str, Any] | None:
    """The owner record a DeltaSink wrote as the table's description, if it is one."""
    try:
        doc = json.loads(description or "")
    except ValueError:
        return None
    record = doc.get(OWNER_RECORD) if isinstance(doc, dict) else None
    return record if isinstance(record, dict) else None


def _local_path(uri: str) -> str:
    """A file of the table as a local path: delta-rs gives them percent-encoded (a space
    as %20), with or without ``file://``."""
    if uri.startswith("file://"):
        uri = urlsplit(uri).path
    return unquote(uri)


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """The rows with exactly ``schema``'s columns, order and types (missing → NULL)."""
    try:
        arrays = [
            rows[f.name].cast(f.type)
            if f.name in rows.column_names
            else pa.nulls(rows.num_rows, f.type)
            for f in schema
        ]
        return pa.Table.from_arrays(arrays, schema=schema)
    except pa.ArrowException as exc:  # a value of another type, a NULL version
        raise SchemaMismatchError(f"delta sink: rows do not fit the table: {exc}") from exc
