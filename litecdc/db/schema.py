"""litecdc's internal tables. Clients can read them but never write them."""

from __future__ import annotations

INTERNAL_PREFIX = "_litecdc_"

JOURNAL_TABLE = "_litecdc_journal"
CHANGES_TABLE = "_litecdc_changes"
TABLE_CIDS_TABLE = "_litecdc_table_cids"

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
CREATE TABLE IF NOT EXISTS {TABLE_CIDS_TABLE}(
    name TEXT PRIMARY KEY,     -- table, view or index name
    cid INTEGER NOT NULL       -- last cid that wrote it (for dependencies)
) WITHOUT ROWID;
"""

#: SQL condition selecting user objects in sqlite_schema (not SQLite's, not litecdc's).
USER_OBJECTS = "substr(name, 1, 7) <> 'sqlite_' AND substr(name, 1, 9) <> '_litecdc_'"
