"""litecdc's internal tables. Clients can read them but never write them."""

from __future__ import annotations

INTERNAL_PREFIX = "_litecdc_"


def is_internal_name(name: str) -> bool:
    """Whether a new object's name falls in litecdc's namespace. SQLite compares names
    without case, so ``_LITECDC_CDC_STATE`` is ``_litecdc_cdc_state``: a client table so
    named before litecdc made its own was then taken for it (security QA)."""
    return name[: len(INTERNAL_PREFIX)].lower() == INTERNAL_PREFIX


JOURNAL_TABLE = "_litecdc_journal"
CHANGES_TABLE = "_litecdc_changes"
TABLE_CIDS_TABLE = "_litecdc_table_cids"
NODE_STATE_TABLE = "_litecdc_node_state"
RESHAPES_TABLE = "_litecdc_reshapes"
UNLOGGED_TABLE = "_litecdc_unlogged"

#: Version of the on-disk layout (the internal tables and what their values mean), kept
#: in _litecdc_node_state under DATA_FORMAT_KEY. Raise it with any change to that layout
#: (and teach db/datafile.py to upgrade older files): an older litecdc then refuses the
#: file instead of misreading it.
#:
#: 1. the journal, changes, node state and table cids (and the CDC state and holds);
#: 2. ``_litecdc_reshapes`` (db/reshape.py): a format-1 file gets it, empty, when opened —
#:    its tables' reshapes are unknown (0) until their next one;
#: 3. ``_litecdc_unlogged`` (db/reshape.py): likewise, a format-2 file gets it empty.
DATA_FORMAT = 3
DATA_FORMAT_KEY = "data_format"

CREATE_INTERNAL = f"""
CREATE TABLE IF NOT EXISTS {JOURNAL_TABLE}(
    cid INTEGER PRIMARY KEY,   -- dense commit id
    query TEXT,                -- the transaction as SQL text; NULL = empty entry
    snapshot INTEGER NOT NULL, -- the cid this transaction depends on
    ts INTEGER NOT NULL DEFAULT 0,   -- leader's clock, Unix ms ("now" on every replica)
    seed INTEGER NOT NULL DEFAULT 0, -- random() / randomblob() seed
    internal INTEGER NOT NULL DEFAULT 0 -- 1 = litecdc's own entry (CDC state, pruning)
);
-- the initial record goes into an empty journal only: once trimmed (journal retention)
-- cid 1 must not come back at the next open, as a gap before every kept entry
INSERT INTO {JOURNAL_TABLE}(cid, query, snapshot)
    SELECT 1, '', 0 WHERE NOT EXISTS (SELECT 1 FROM {JOURNAL_TABLE});
CREATE TABLE IF NOT EXISTS {CHANGES_TABLE}(
    id INTEGER PRIMARY KEY,    -- cid << 24 | seq: (cid, seq) order in one B-tree
    cid INTEGER NOT NULL,
    seq INTEGER NOT NULL,      -- order of the change within its transaction, from 1
    tbl TEXT NOT NULL,
    op TEXT NOT NULL,          -- insert | update | delete
    old_rowid INTEGER,
    new_rowid INTEGER,
    pk BLOB NOT NULL,          -- MessagePack map: primary-key column -> value
    before BLOB,               -- MessagePack map of the full row before (update, delete)
    after BLOB,                -- MessagePack map of the full row after (insert, update)
    ts INTEGER NOT NULL        -- commit timestamp, Unix ms
);
CREATE TABLE IF NOT EXISTS {NODE_STATE_TABLE}(
    name TEXT PRIMARY KEY,     -- e.g. 'applied_revision': this node's progress in the log
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS {TABLE_CIDS_TABLE}(
    name TEXT PRIMARY KEY,     -- table, view or index name; 'sqlite_schema' = the schema
    cid INTEGER NOT NULL,      -- last cid that wrote it (for dependencies)
    read_cid INTEGER NOT NULL DEFAULT 0  -- last cid that read it
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS {RESHAPES_TABLE}(
    name TEXT PRIMARY KEY COLLATE NOCASE, -- a user table, named as it is now
    cid INTEGER NOT NULL       -- the commit that created it (or renamed it to this name), or
                               -- last changed it other than by adding a column (db/reshape.py)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS {UNLOGGED_TABLE}(
    name TEXT NOT NULL COLLATE NOCASE, -- a table name (kept once the table is dropped)
    cid INTEGER NOT NULL,      -- a commit that changed the rows under that name without
                               -- row changes: dropped, renamed, created from a query, a
                               -- column dropped or given a default (db/reshape.py)
    PRIMARY KEY (name, cid)
) WITHOUT ROWID;
"""

#: the name under which _litecdc_table_cids keeps the cid of the last schema change
SCHEMA_OBJECT = "sqlite_schema"

#: SQL condition selecting user objects in sqlite_schema (not SQLite's, not litecdc's).
USER_OBJECTS = "substr(name, 1, 7) <> 'sqlite_' AND substr(name, 1, 9) <> '_litecdc_'"

#: Change ids are ``cid << SEQ_BITS | seq``: one ordered B-tree, no extra index.
SEQ_BITS = 24

CDC_STATE_TABLE = "_litecdc_cdc_state"
#: Created through the log (an internal journal entry) when a CDC service first leads.
CREATE_CDC_STATE = (
    f"CREATE TABLE IF NOT EXISTS {CDC_STATE_TABLE}("
    "name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;"
)


def last_change_id(cid: int) -> int:
    """The largest change id a transaction ``cid`` can have."""
    return ((cid + 1) << SEQ_BITS) - 1


HOLDS_TABLE = "_litecdc_holds"
#: Retention holds of pull subscribers (the pipeline): the change log is kept after each
#: hold's cid. Created through the log, like the CDC state table.
CREATE_HOLDS = (
    f"CREATE TABLE IF NOT EXISTS {HOLDS_TABLE}("
    "name TEXT PRIMARY KEY, cid INTEGER NOT NULL, expired INTEGER NOT NULL DEFAULT 0"
    ") WITHOUT ROWID;"
)

#: every object litecdc itself creates; any other name with the prefix is refused
INTERNAL_TABLES = frozenset(
    {
        JOURNAL_TABLE,
        CHANGES_TABLE,
        TABLE_CIDS_TABLE,
        NODE_STATE_TABLE,
        RESHAPES_TABLE,
        UNLOGGED_TABLE,
        CDC_STATE_TABLE,
        HOLDS_TABLE,
    }
)

#: Default retention cap: a hold older than this many commits behind the head expires
#: (its subscriber must re-snapshot), and without holds changes are kept this long.
DEFAULT_RETENTION_CIDS = 1_000_000


def sql_text(value: str) -> str:
    """``value`` as an SQL string literal (internal entries are plain SQL text)."""
    return "'" + value.replace("'", "''") + "'"


def prune_sql(retention_cids: int, *, webhook: bool, create: bool = True) -> str:
    """The internal statements that expire holds past the cap and prune the change log.

    What is kept: everything after the CDC webhook's high watermark when the leader runs
    a webhook (``webhook``; all of it before the first delivery, so nothing is lost while
    an endpoint is down from the start; a watermark left by a webhook since removed from
    the configuration pins nothing) and after every live hold; holds more than
    ``retention_cids`` commits behind the head expire. With neither a webhook nor a hold,
    the newest ``retention_cids`` commits are kept. The cid pruned through is recorded as
    ``pruned`` in the CDC state table, so a subscriber asking for older changes gets a
    clear "no longer available". The SQL is written by the leader and every value it
    reads comes from replicated tables, so each replica prunes
    exactly the same rows.
    """
    cap = int(retention_cids)
    head = f"(SELECT max(cid) FROM {JOURNAL_TABLE})"
    state = CDC_STATE_TABLE
    hwm = f"coalesce((SELECT value FROM {state} WHERE name = 'hwm'), 0)" if webhook else "NULL"
    oldest_hold = f"(SELECT min(cid) FROM {HOLDS_TABLE} WHERE expired = 0)"
    prune_to = (
        f"CASE WHEN {hwm} IS NULL AND {oldest_hold} IS NULL THEN max({head} - {cap}, 0) "
        f"ELSE min(coalesce({hwm}, {head}), coalesce({oldest_hold}, {head})) END"
    )
    return (
        (f"{CREATE_CDC_STATE}\n{CREATE_HOLDS}\n" if create else "")
        + f"UPDATE {HOLDS_TABLE} SET expired = 1 WHERE expired = 0 AND cid < {head} - {cap};\n"
        f"INSERT INTO {state}(name, value) SELECT 'pruned', p FROM "
        f"(SELECT {prune_to} AS p) "
        f"WHERE p > coalesce((SELECT value FROM {state} WHERE name = 'pruned'), 0) "
        "ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value);\n"
        f"DELETE FROM {CHANGES_TABLE} WHERE id <= "
        f"((coalesce((SELECT value FROM {state} WHERE name = 'pruned'), 0) + 1) << {SEQ_BITS}) - 1;"
    )


def register_hold_sql(
    name: str, retention_cids: int, *, webhook: bool, cid: int | None = None
) -> str:
    """Place (or restart) the hold of subscriber ``name`` at the current head, or at
    ``cid`` — only while the change log still holds what follows it (not pruned through
    it) and a hold there would not expire at once (at most ``retention_cids`` behind the
    head); otherwise the hold stays as it was, and the caller reads it back to tell."""
    if cid is None:
        placed = f"SELECT {sql_text(name)}, max(cid), 0 FROM {JOURNAL_TABLE} WHERE true "
    else:
        at = int(cid)
        pruned = f"coalesce((SELECT value FROM {CDC_STATE_TABLE} WHERE name = 'pruned'), 0)"
        head = f"(SELECT max(cid) FROM {JOURNAL_TABLE})"
        placed = (
            f"SELECT {sql_text(name)}, {at}, 0 "
            f"WHERE {at} >= {pruned} AND {at} >= {head} - {int(retention_cids)} "
        )
    return (
        f"{CREATE_CDC_STATE}\n{CREATE_HOLDS}\n"
        f"INSERT INTO {HOLDS_TABLE}(name, cid, expired) {placed}"
        "ON CONFLICT(name) DO UPDATE SET cid = excluded.cid, expired = 0;\n"
        + prune_sql(retention_cids, webhook=webhook, create=False)
    )


def advance_hold_sql(name: str, cid: int, retention_cids: int, *, webhook: bool) -> str:
    """Move the hold of ``name`` forward to ``cid`` (never back), then prune."""
    return (
        f"{CREATE_CDC_STATE}\n{CREATE_HOLDS}\n"
        f"UPDATE {HOLDS_TABLE} SET cid = max(cid, {int(cid)}) "
        f"WHERE name = {sql_text(name)} AND expired = 0;\n"
        + prune_sql(retention_cids, webhook=webhook, create=False)
    )


def release_hold_sql(name: str, retention_cids: int, *, webhook: bool) -> str:
    """Drop the hold of ``name``, then prune what only it kept."""
    return (
        f"{CREATE_CDC_STATE}\n{CREATE_HOLDS}\n"
        f"DELETE FROM {HOLDS_TABLE} WHERE name = {sql_text(name)};\n"
        + prune_sql(retention_cids, webhook=webhook, create=False)
    )


def high_watermark_sql(hwm: int, retention_cids: int = DEFAULT_RETENTION_CIDS) -> str:
    """The internal entry that records the CDC high watermark and prunes what it covers
    (and no live hold still needs).

    Every replica applies it, so each deletes the same delivered changes.
    """
    hwm = int(hwm)
    return (
        f"INSERT INTO {CDC_STATE_TABLE}(name, value) VALUES('hwm', {hwm}) "
        "ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value);\n"
        # (creates the holds table on nodes that have none yet)
        + prune_sql(retention_cids, webhook=True)
    )
