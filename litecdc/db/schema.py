"""litecdc's internal tables. Clients can read them but never write them."""

from __future__ import annotations

INTERNAL_PREFIX = "_litecdc_"

JOURNAL_TABLE = "_litecdc_journal"
CHANGES_TABLE = "_litecdc_changes"
TABLE_CIDS_TABLE = "_litecdc_table_cids"
NODE_STATE_TABLE = "_litecdc_node_state"

CREATE_INTERNAL = f"""
CREATE TABLE IF NOT EXISTS {JOURNAL_TABLE}(
    cid INTEGER PRIMARY KEY,   -- dense commit id
    query TEXT,                -- the transaction as SQL text; NULL = empty entry
    snapshot INTEGER NOT NULL, -- the cid this transaction depends on
    ts INTEGER NOT NULL DEFAULT 0,   -- leader's clock, Unix ms ("now" on every replica)
    seed INTEGER NOT NULL DEFAULT 0, -- random() / randomblob() seed
    internal INTEGER NOT NULL DEFAULT 0 -- 1 = litecdc's own entry (CDC state, pruning)
);
INSERT OR IGNORE INTO {JOURNAL_TABLE}(cid, query, snapshot) VALUES (1, '', 0);
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


def high_watermark_sql(hwm: int) -> str:
    """The internal entry that records the CDC high watermark and prunes what it covers.

    Every replica applies it, so each deletes the same delivered changes.
    """
    hwm = int(hwm)
    return (
        f"INSERT INTO {CDC_STATE_TABLE}(name, value) VALUES('hwm', {hwm}) "
        "ON CONFLICT(name) DO UPDATE SET value = max(value, excluded.value);\n"
        f"DELETE FROM {CHANGES_TABLE} WHERE id <= {last_change_id(hwm)};"
    )
