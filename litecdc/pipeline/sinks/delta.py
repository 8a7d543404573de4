"""Delta Lake mirror through delta-rs (the ``deltalake`` package; no JVM).

The table at the path holds the source table's columns plus ``_litecdc_cid``. Every
write is one MERGE on the key columns with the version guard (a row is replaced only
by a higher cid; a delete removes it only if its stored cid is lower).

A change batch is one MERGE (upserts and deletes together, from the net events with
an op column) whose commit carries the Delta app transaction
``(litecdc-<subscription>, end_cid)``: ``applied_cid()`` reads it back, and a batch
at or below it is skipped. That record is what stops a replayed older batch from
resurrecting rows a newer batch deleted (the cid guard alone cannot: the row is gone,
so nothing is left to compare against).

Not done here: compaction and vacuum. Each commit adds files; run
``DeltaTable(path).optimize.compact()`` and ``vacuum()`` from time to time.

Example::

    sink = DeltaSink("delta:/data/lake/orders", spec, "orders-lake")
    sink.prepare()
    sink.write_changes(events, ChangeBatch("orders-lake", after_cid=0, end_cid=42))
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import DeltaError

from litecdc.errors import SchemaMismatchError, SinkError
from litecdc.pipeline.events import net_changes
from litecdc.pipeline.sinks.base import ChangeBatch, Sink
from litecdc.pipeline.sinks.registry import DeltaOptions, parse_sink_url
from litecdc.pipeline.tables import CID_COLUMN, OP_COLUMN, OP_DELETE, OP_UPSERT, TableSpec

log = logging.getLogger("litecdc.pipeline")

#: Delta primitive type of each Arrow type a TableSpec uses.
DELTA_TYPES = {"int64": "long", "float64": "double", "string": "string", "binary": "binary"}

_ERRORS = (DeltaError, OSError, pa.ArrowException)


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
        self.app_id = f"litecdc-{subscription}"
        self._table: DeltaTable | None = None

    # -- set-up -----------------------------------------------------------------------

    def prepare(self) -> None:
        try:
            if DeltaTable.is_deltatable(self.path):
                table = DeltaTable(self.path)
                self._add_missing_columns(table)
            else:
                table = DeltaTable.create(self.path, self.spec.row_schema(), mode="ignore")
                log.info("delta sink: created table %s", self.path)
        except _ERRORS as exc:
            raise SinkError(f"delta sink: cannot open or create {self.path}: {exc}") from exc
        self._table = table

    def _add_missing_columns(self, table: DeltaTable) -> None:
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
        if missing:
            table.alter.add_columns(missing)
            log.info("delta sink: added columns %s to %s", [f.name for f in missing], self.path)

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
            (
                self._merger(source, None)
                .when_matched_update_all(predicate=f"s.{CID_COLUMN} > t.{CID_COLUMN}")
                .when_not_matched_insert_all()
                .execute()
            )
        except _ERRORS as exc:
            raise SinkError(f"delta sink: snapshot merge into {self.path} failed: {exc}") from exc

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
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
                (
                    self._merger(source, commit)
                    .when_matched_update_all(
                        predicate=f"{upsert} AND s.{CID_COLUMN} > t.{CID_COLUMN}",
                        except_cols=[OP_COLUMN],
                    )
                    .when_matched_delete(
                        predicate=f"s.{OP_COLUMN} = '{OP_DELETE}' "
                        f"AND t.{CID_COLUMN} < s.{CID_COLUMN}"
                    )
                    .when_not_matched_insert_all(predicate=upsert, except_cols=[OP_COLUMN])
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

    def _merger(self, source: pa.Table, commit: CommitProperties | None) -> Any:
        on = " AND ".join(f"t.{_ident(k)} = s.{_ident(k)}" for k in self.spec.key)
        return self._dt().merge(
            source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            commit_properties=commit,
        )

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
        table = self._dt()
        try:
            table.update_incremental()  # another process may have committed since
            version = table.transaction_version(self.app_id)
        except _ERRORS as exc:
            raise SinkError(f"delta sink: reading {self.path} failed: {exc}") from exc
        return int(version or 0)

    def read_rows(self) -> pa.Table:
        if self._table is None and not DeltaTable.is_deltatable(self.path):
            # verify must not create what it checks
            raise SinkError(
                f"delta sink: there is no Delta table at {self.path} yet: has `litecdc "
                "pipeline run` copied this subscription?"
            )
        table = self._dt()
        try:
            table.update_incremental()
            # The current version's files, read with pyarrow's own local filesystem: going
            # through to_pyarrow_table (delta-rs's filesystem handler) made the process abort
            # at exit more often than not ("terminate called without an active exception",
            # delta-io/delta-rs#2184). The sink's tables are local, written by MERGE/append
            # without deletion vectors; files from before an added column read it as NULL.
            files = ds.dataset(table.file_uris(), format="parquet", schema=self.spec.row_schema())
            rows = files.to_table(columns=self.spec.column_names)
        except _ERRORS as exc:
            raise SinkError(f"delta sink: reading {self.path} failed: {exc}") from exc
        return rows.sort_by([(k, "ascending") for k in self.spec.key])

    def close(self) -> None:
        self._table = None


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
