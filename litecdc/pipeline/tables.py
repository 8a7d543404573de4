"""What the pipeline knows of a source table: its columns, their Arrow types, its key.

The node describes a table (``GET /cdc/tables/{name}``); every reader, sink and the
verifier work from this one description. SQLite columns are dynamically typed, so
each column gets the Arrow type its declared type's affinity implies (see
``litecdc.db.source.arrow_type_name``) and a value that does not fit is reported as a
schema mismatch, never silently converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from litecdc.errors import SchemaMismatchError

# the names both ends agree on (litecdc.wire), re-exported for the pipeline's modules
from litecdc.wire import (
    ARROW_TYPES,
    CID_COLUMN,
    OP_COLUMN,
    OP_DELETE,
    OP_UPSERT,
    ROWID_COLUMN,
    SEQ_COLUMN,
)

__all__ = [
    "ARROW_TYPES",
    "CID_COLUMN",
    "OP_COLUMN",
    "OP_DELETE",
    "OP_UPSERT",
    "ROWID_COLUMN",
    "SEQ_COLUMN",
    "Column",
    "TableSpec",
    "check_followable",
]


@dataclass(frozen=True)
class Column:
    name: str
    declared_type: str  # as written in CREATE TABLE ('' when none)
    arrow: str  # one of ARROW_TYPES
    not_null: bool = False
    #: the column's DEFAULT as SQL text, None when it has none. SQLite fills existing rows
    #: with it on ALTER TABLE ADD COLUMN without any row change: a mirror must re-copy.
    default: str | None = None

    @property
    def arrow_type(self) -> pa.DataType:
        return ARROW_TYPES[self.arrow]


def named_as(spec: TableSpec, name: str) -> TableSpec:
    """``spec`` under ``name``, the table's name as its subscription took it (the node's
    spelling then). SQLite names tables without case: a table dropped and created again
    as ``KK`` is still the subscription's ``Kk`` — its sink keeps its destination, and its
    messages their table name (QA: a PostgreSQL mirror was created anew as "KK" and the
    old one left stale; a Delta mirror refused the 'other' table for good)."""
    return spec if spec.name == name else replace(spec, name=name)


@dataclass(frozen=True)
class TableSpec:
    """A source table as the pipeline mirrors it.

    ``columns`` are the table's own columns in order, plus ``_litecdc_rowid`` first
    when the table has no declared primary key (its rowid is then the key).
    """

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TableSpec:
        columns = tuple(
            Column(
                c["name"],
                c.get("declared_type", ""),
                c["arrow"],
                bool(c.get("not_null")),
                c.get("default"),
            )
            for c in doc["columns"]
        )
        return cls(doc["table"], columns, tuple(doc["key"]))

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.name,
            "columns": [
                {
                    "name": c.name,
                    "declared_type": c.declared_type,
                    "arrow": c.arrow,
                    "not_null": c.not_null,
                    "default": c.default,
                }
                for c in self.columns
            ],
            "key": list(self.key),
        }

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def row_schema(self) -> pa.Schema:
        """Snapshot rows: the table's columns, then the version column."""
        fields = [pa.field(c.name, c.arrow_type) for c in self.columns]
        return pa.schema([*fields, pa.field(CID_COLUMN, pa.int64(), nullable=False)])

    def change_schema(self) -> pa.Schema:
        """Change events: cid, seq, op, then the row (the after image of an upsert, the
        before image of a delete)."""
        fields = [pa.field(c.name, c.arrow_type) for c in self.columns]
        return pa.schema(
            [
                pa.field(CID_COLUMN, pa.int64(), nullable=False),
                pa.field(SEQ_COLUMN, pa.int64(), nullable=False),
                pa.field(OP_COLUMN, pa.string(), nullable=False),
                *fields,
            ]
        )

    def added_columns(self, previous: TableSpec) -> list[Column]:
        """Columns of this description that ``previous`` did not have (source ALTER TABLE)."""
        known = set(previous.column_names)
        return [c for c in self.columns if c.name not in known]


def check_followable(mirrored: TableSpec, spec: TableSpec) -> None:
    """SchemaMismatchError unless the source table ``spec`` only adds columns to the one
    the sink mirrors (a dropped or renamed column, a changed type or key cannot be
    followed: the mirror would keep stale columns or lose values)."""
    # the rowid column comes and goes with the key (described as such below): compare
    # the table's own columns
    was = [c for c in mirrored.columns if c.name != ROWID_COLUMN]
    now = [c for c in spec.columns if c.name != ROWID_COLUMN]
    was_names = [c.name for c in was]
    now_names = [c.name for c in now]
    old = {c.name: c.arrow for c in was}
    changed = [c.name for c in now if c.name in old and old[c.name] != c.arrow]
    dropped = [n for n in old if n not in now_names]
    # SQLite adds a column at the end only: the mirrored columns stay a prefix, in order.
    # A name out of its place was dropped or renamed and added again (the mirror would
    # keep the old values under it)
    prefix = now_names[: len(was)]
    moved = [n for n, before in zip(prefix, was_names, strict=False) if n != before]
    if not dropped:
        dropped = [n for n in was_names if n in moved or n not in prefix]
    if changed or dropped or spec.key != mirrored.key:
        found = [
            *([f"changed type: {changed}"] if changed else []),
            *([f"dropped or renamed: {dropped}"] if dropped else []),
            # (only when it changed: QA read "key ['id'] -> ['id']" as a key change)
            *(
                [f"key {_key_words(mirrored.key)} -> {_key_words(spec.key, now=True)}"]
                if spec.key != mirrored.key
                else []
            ),
        ]
        raise SchemaMismatchError(
            f"table {spec.name} changed at the source in a way the sink cannot follow "
            f"({', '.join(found)}); to rebuild the mirror, unsubscribe, delete it (or choose "
            "a new path or table) and subscribe again"
        )


def _key_words(key: tuple[str, ...], *, now: bool = False) -> str:
    # QA: CREATE TABLE … AS SELECT declares no PRIMARY KEY; "['id'] -> ['_litecdc_rowid']"
    # did not say so (the hint only where the table has lost its key: register QA)
    if key != (ROWID_COLUMN,):
        return str(list(key))
    if now:
        return "the rowid (no PRIMARY KEY declared, as after CREATE TABLE … AS SELECT)"
    return "the rowid"
