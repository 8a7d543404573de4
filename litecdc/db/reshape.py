"""Which tables a write *reshapes*: creates, or changes other than by adding a column.

A copy of a table kept up to date from its row changes (the pipeline's mirrors) goes
wrong when DDL changes rows without any row change: ``DROP TABLE`` takes every row away
(and a table created again under the name starts empty), ``ALTER TABLE … DROP COLUMN``
takes a column's values, ``RENAME TO`` brings a whole table under a name. Only
``ADD COLUMN`` keeps every row as it was, with one more column at the end. So the engine
records, per table, the cid of its last reshape (``_litecdc_reshapes``, written in the
transaction of the DDL): a consumer whose copy is older than that copies the table
again (``GET /cdc/tables/NAME`` reports it as ``reshaped_cid``).

SQLite tells the authorizer which table a statement creates, drops or alters when it
prepares it, but not how: ``ADD COLUMN`` and ``DROP COLUMN`` look alike, ``RENAME TO``
does not name the new name, and ``CREATE TABLE IF NOT EXISTS`` is reported whether or
not it creates anything. So each such statement is judged by what it did
(:class:`ReshapeWatch`): the tables it names are read before it runs — their columns as
``pragma_table_xinfo`` gives them — and again once it has run. A table that appears was
created (or renamed to that name); one whose columns changed other than by gaining
columns at the end was reshaped; one that is gone was dropped (or renamed away) and has
no record any more. This is judged statement by statement: a transaction that drops a
column and adds it back, or drops a table and creates it again, ends with the columns it
started with.

Some of that DDL also changes the table's *rows* without a row change
(``_litecdc_unlogged``, db/schema.py): ``DROP TABLE`` and ``RENAME TO`` of a table that
had rows (they vanish from its name), ``CREATE TABLE … AS SELECT`` or ``RENAME TO`` that
brings rows under a name, ``DROP``/``RENAME COLUMN`` on a table with rows (values gone
or renamed), and ``ADD COLUMN`` with a DEFAULT other than NULL on one (every row gains
that value). The change log after a cid before such a commit cannot rebuild the table
past it: a changes read across it is refused (db/source.py). A plain ``CREATE TABLE``
(empty) is not one — its change events are the whole table — and the record of a
dropped name is kept, so a reader from before the drop still learns of it once the
name is created again.

Every replica runs the same statements on the same schema (the journal's SQL text), so
each records the same cids: on the leader (``Engine.run_write``), on a follower or a
replay (``Engine.apply_entry``) and in a database rebuilt from the journal alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litecdc.db.schema import USER_OBJECTS

#: runs litecdc's own read on the writer connection (``Engine._internal``)
Query = Callable[[str, Any], list[tuple[Any, ...]]]
#: a table's columns as ``pragma_table_xinfo`` gives them (None: no such table)
Shape = tuple[tuple[Any, ...], ...] | None

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold(name: str) -> str:
    """``name`` as SQLite compares table names: ASCII letters without case (only those:
    ``É`` and ``é`` name two tables), as ``COLLATE NOCASE`` does."""
    return name.translate(_ASCII_LOWER)


def reshaped(before: Shape, after: Shape) -> bool:
    """Whether a table whose columns were ``before`` and are now ``after`` was reshaped:
    created, or changed other than by columns added at the end (False when gone)."""
    if after is None:
        return False
    if before is None:
        return True
    return after[: len(before)] != before


def gives_rows_a_value(default: str | None) -> bool:
    """Whether a column added with this ``dflt_value`` gives existing rows a value (one
    other than NULL) without any row change."""
    if default is None:
        return False
    bare = default.strip()
    while bare.startswith("(") and bare.endswith(")"):  # ((NULL)) is NULL too
        bare = bare[1:-1].strip()
    return bare.upper() != "NULL"


def unlogged(before: Shape, after: Shape, had_rows: bool, has_rows: bool) -> bool:
    """Whether a statement that took a table from ``before`` to ``after`` changed its rows
    without row changes (see the module's description)."""
    if before is None:
        return after is not None and has_rows  # created from a query, or renamed here
    if after is None:
        return had_rows  # dropped, or renamed away
    if not has_rows:
        return False
    if reshaped(before, after):
        return True
    return any(gives_rows_a_value(column[3]) for column in after[len(before) :])


class ReshapeWatch:
    """Notes the tables reshaped by the statements of one write, as they run.

    Call :meth:`statement` once each SQL statement is prepared, before it runs (an exec
    tracer), and :meth:`finish` after the last one; :attr:`reshaped` then holds, by
    :func:`fold`-ed name, each table's name now, or None for a table that is gone.
    """

    def __init__(self, query: Query, take_table_ddl: Callable[[], list[tuple[str, bool]]]) -> None:
        self._query = query
        self._take = take_table_ddl
        #: the statement running now: its tables' shapes before it and whether they had
        #: rows, and (for ALTER TABLE, which may rename) the root pages of those it alters
        self._shapes: dict[str, tuple[str, Shape, bool]] | None = None
        self._roots: list[tuple[str, int]] | None = None
        self.reshaped: dict[str, str | None] = {}
        self.unlogged: set[str] = set()

    def statement(self) -> None:
        """A statement was prepared and is about to run: settle the one before it, and
        read the tables this one creates, drops or alters (when it does)."""
        self.finish()
        ddl = self._take()
        if not ddl:
            return
        shapes = {fold(name): (name, self._shape(name)) for name, _ in ddl}
        self._shapes = {
            key: (name, shape, shape is not None and self._has_rows(name))
            for key, (name, shape) in shapes.items()
        }
        altered = [name for name, alter in ddl if alter]
        self._roots = [(fold(n), r) for n in altered for r in self._root(n)] or None

    def trace(self, cursor: Any, sql: str, bindings: Any) -> bool:
        """:meth:`statement` as an APSW exec tracer (the statement always runs)."""
        self.statement()
        return True

    def finish(self) -> None:
        """The statement noted last has run: note what it reshaped."""
        shapes, roots = self._shapes, self._roots
        self._shapes = self._roots = None
        if shapes is None:
            return
        for key, (name, before, had_rows) in shapes.items():
            after = self._shape(name)
            if after is None:
                if before is not None:
                    self.reshaped[key] = None  # dropped, or renamed away
            elif reshaped(before, after):
                self.reshaped[key] = name  # (SQLite names it as it is stored)
            if unlogged(before, after, had_rows, after is not None and self._has_rows(name)):
                self.unlogged.add(key)
        # ALTER TABLE … RENAME TO: the table under its new name, found by its root page
        # (a rename moves no page; the name it left is the one the statement named, gone
        # above). One lookup, not a list of every table before and after (QA: each ALTER
        # cost ~0.6 ms more with 50 tables, 2-3x with 2000)
        for key, root in roots or ():
            if key in self.reshaped and self.reshaped[key] is None:
                for new in self._named_at(root):
                    if fold(new) != key:
                        self.reshaped[fold(new)] = new
                        if self._has_rows(new):
                            self.unlogged.add(fold(new))

    def _shape(self, name: str) -> Shape:
        rows = self._query(
            'SELECT x.name, x.type, x."notnull", x.dflt_value, x.pk, x.hidden '
            "FROM pragma_table_list AS l, pragma_table_xinfo(l.name, l.schema) AS x "
            "WHERE l.schema = 'main' AND l.type = 'table' AND l.name = ? COLLATE NOCASE "
            "ORDER BY x.cid",
            (name,),
        )
        return tuple(rows) if rows else None

    def _has_rows(self, name: str) -> bool:
        quoted = '"' + name.replace('"', '""') + '"'
        return bool(self._query(f"SELECT EXISTS (SELECT 1 FROM main.{quoted})", None)[0][0])

    def _root(self, name: str) -> list[int]:
        rows = self._query(
            "SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = ? COLLATE NOCASE",
            (name,),
        )
        return [int(row[0]) for row in rows if row[0]]

    def _named_at(self, root: int) -> list[str]:
        rows = self._query(
            f"SELECT name FROM sqlite_schema WHERE type = 'table' AND rootpage = ? "
            f"AND {USER_OBJECTS}",
            (root,),
        )
        return [str(row[0]) for row in rows]
