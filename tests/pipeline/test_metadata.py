"""The metadata store: every behaviour against SQLite and a real PostgreSQL server."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from litecdc.errors import MetadataError
from litecdc.localservers import free_port
from litecdc.localservers.process import LocalServer
from litecdc.pipeline import metadata
from litecdc.pipeline.metadata import (
    RANGE_DONE,
    STAGE_INCREMENTAL,
    STAGE_REGISTER,
    STAGE_SNAPSHOT,
    MetadataStore,
    redact_url,
    sqlite_url,
)

SOURCE = "http://127.0.0.1:4001"


@pytest.fixture(params=["sqlite", "postgresql"])
def meta_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty metadata store URL of each backend."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "meta.db")
    url: str = request.getfixturevalue("postgresql_db_url")
    return url


@pytest.fixture
def open_store(meta_url: str) -> Iterator[Callable[..., MetadataStore]]:
    """Opens stores on ``meta_url``; all closed after the test."""
    opened: list[MetadataStore] = []

    def _open(**kwargs: object) -> MetadataStore:
        store = MetadataStore.open(meta_url, **kwargs)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Callable[..., MetadataStore]) -> MetadataStore:
    return open_store()


def add(store: MetadataStore, name: str = "orders-lake", **kwargs: object) -> None:
    store.add_subscription(
        name,
        table_name=str(kwargs.pop("table_name", "orders")),
        sources=[SOURCE],
        sink=str(kwargs.pop("sink", "delta:/data/lake/orders")),
        **kwargs,  # type: ignore[arg-type]
    )


def to_incremental(store: MetadataStore, name: str = "orders-lake", init_cid: int = 10) -> None:
    store.start_register(name, init_cid)
    store.set_ranges(name, [(None, None)])
    store.record_chunk(name, 0, [5], init_cid + 1, 5, True)
    store.finish_snapshot(name)


# --- subscriptions --------------------------------------------------------------------------


def test_add_and_get_subscription_with_defaults(store: MetadataStore) -> None:
    sub = store.add_subscription(
        "orders-lake",
        table_name="orders",
        sources=[SOURCE, "http://127.0.0.1:4002"],
        sink="delta:/data/lake/orders",
        options={"max_events": 100_000, "partitions": 4},
    )
    assert sub == store.get_subscription("orders-lake")
    assert sub.table_name == sub.table == "orders"
    assert sub.sources == (SOURCE, "http://127.0.0.1:4002")
    assert sub.options == {"max_events": 100_000, "partitions": 4}
    assert (sub.cluster, sub.db, sub.subscriber, sub.owner) == (
        "default",
        "main",
        "orders-lake",
        "default",
    )
    assert sub.cancel is False
    assert sub.created_at is not None and sub.created_at.tzinfo is not None


def test_add_is_retry_safe_but_a_taken_name_is_an_error(store: MetadataStore) -> None:
    add(store)
    add(store)  # the same definition again: a retry
    assert [s.name for s in store.list_subscriptions()] == ["orders-lake"]
    with pytest.raises(MetadataError, match="already exists"):
        add(store, sink="postgresql://127.0.0.1/other")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "non-empty name"),
        ({"sources": []}, "sources"),
        ({"sources": "http://x"}, "sources"),
        ({"sink": ""}, "sink is empty"),
        ({"table_name": ""}, "table_name is empty"),
        ({"options": {"x": object()}}, "options are not JSON"),
        # the name is the hold's path segment on the node: it could never be released
        ({"name": "bad name/../x"}, "subscriber name is 1 to 200 letters"),
        ({"name": ".."}, "subscriber name"),
        ({"subscriber": "a/b"}, "subscriber name"),
    ],
)
def test_add_rejects_bad_definitions(
    store: MetadataStore, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {
        "name": "s",
        "table_name": "t",
        "sources": [SOURCE],
        "sink": "delta:/x",
        **kwargs,
    }
    with pytest.raises(MetadataError, match=message):
        store.add_subscription(**args)  # type: ignore[arg-type]
    assert store.list_subscriptions(include_cancelled=True) == []


def test_unknown_subscription_is_a_clear_error(store: MetadataStore) -> None:
    for call in (
        lambda: store.get_subscription("nope"),
        lambda: store.progress("nope"),
        lambda: store.request_cancel("nope"),
        lambda: store.start_register("nope", 1),
    ):
        with pytest.raises(MetadataError, match="unknown subscription 'nope'"):
            call()


def test_cancel_and_remove(store: MetadataStore) -> None:
    add(store, "a")
    add(store, "b")
    to_incremental(store, "a")
    assert store.request_cancel("a").cancel
    assert store.request_cancel("a").cancel  # retry
    assert [s.name for s in store.list_subscriptions()] == ["b"]
    assert [s.name for s in store.list_subscriptions(include_cancelled=True)] == ["a", "b"]
    # A cancelled name is still taken until the subscription is removed.
    with pytest.raises(MetadataError, match="being cancelled"):
        add(store, "a")
    assert store.remove_subscription("a") is True
    assert store.remove_subscription("a") is False  # retry: already gone
    with pytest.raises(MetadataError, match="unknown subscription"):
        store.progress("a")
    # Its progress went with it: the name starts afresh.
    add(store, "a")
    assert store.progress("a").stage is None


def test_list_by_owner(store: MetadataStore) -> None:
    add(store, "x1", owner="x")
    add(store, "y1", owner="y")
    add(store, "x2", owner="x")
    assert [s.name for s in store.list_subscriptions(owner="x")] == ["x1", "x2"]
    assert [s.name for s in store.list_subscriptions(owner="y")] == ["y1"]
    assert [s.name for s in store.list_subscriptions()] == ["x1", "x2", "y1"]


# --- stages ---------------------------------------------------------------------------------


def test_full_flow_register_snapshot_incremental(store: MetadataStore) -> None:
    add(store)
    assert store.progress("orders-lake").stage is None
    p = store.start_register("orders-lake", 42)
    assert (p.stage, p.init_snapshot_version, p.last_log_index, p.ranges) == (
        STAGE_REGISTER,
        42,
        None,
        (),
    )
    p = store.set_ranges(
        "orders-lake", [(None, [1000]), ([1000], [2000, "b"]), ([2000, "b"], None)]
    )
    assert p.stage == STAGE_SNAPSHOT
    assert [(r.range_id, r.lower_key, r.upper_key) for r in p.ranges] == [
        (0, None, [1000]),
        (1, [1000], [2000, "b"]),
        (2, [2000, "b"], None),
    ]
    assert all(r.last_snapshot_key is None and r.rows_copied == 0 for r in p.ranges)
    assert all(r.init_snapshot_version == 42 for r in p.ranges)

    r = store.record_chunk("orders-lake", 0, [500], 43, 500, False)
    assert (r.stage, r.last_snapshot_key, r.current_snapshot_version, r.rows_copied) == (
        STAGE_SNAPSHOT,
        [500],
        43,
        500,
    )
    r = store.record_chunk("orders-lake", 0, [999], 45, 499, True)
    assert (r.stage, r.last_snapshot_key, r.current_snapshot_version, r.rows_copied) == (
        RANGE_DONE,
        [999],
        45,
        999,
    )
    with pytest.raises(MetadataError, match="not done yet: 1, 2"):
        store.finish_snapshot("orders-lake")
    store.record_chunk("orders-lake", 1, [1999, "z"], 46, 1000, True)
    store.record_chunk("orders-lake", 2, None, 47, 0, True)  # an empty last range
    p = store.progress("orders-lake")
    assert p.snapshot_done and p.rows_copied == 1999
    assert p.ranges[2].last_snapshot_key is None and p.ranges[2].done

    p = store.finish_snapshot("orders-lake")
    assert (p.stage, p.last_log_index) == (STAGE_INCREMENTAL, 42)
    assert store.record_log_position("orders-lake", 60) == 60
    assert store.record_log_position("orders-lake", 55) == 60  # a late batch: ignored
    assert store.record_log_position("orders-lake", 61) == 61
    assert store.progress("orders-lake").last_log_index == 61


def test_every_step_is_retry_safe(store: MetadataStore) -> None:
    add(store)
    for _ in range(2):
        store.start_register("orders-lake", 7)
    ranges = [(None, [10]), ([10], None)]
    for _ in range(2):
        store.set_ranges("orders-lake", ranges)
    for _ in range(2):
        store.record_chunk("orders-lake", 0, [4], 8, 4, False)
    assert store.progress("orders-lake").ranges[0].rows_copied == 4
    for _ in range(2):
        store.record_chunk("orders-lake", 0, [9], 9, 5, True)
    for _ in range(2):
        store.record_chunk("orders-lake", 1, [20], 9, 10, True)
    before = store.progress("orders-lake")
    assert before.rows_copied == 19
    for _ in range(2):
        store.finish_snapshot("orders-lake")
    for _ in range(2):
        store.record_log_position("orders-lake", 30)
    # Retried earlier steps after moving on change nothing.
    store.start_register("orders-lake", 7)
    store.set_ranges("orders-lake", ranges)
    store.record_chunk("orders-lake", 1, [20], 9, 10, True)
    after = store.progress("orders-lake")
    assert (after.stage, after.last_log_index, after.rows_copied) == (STAGE_INCREMENTAL, 30, 19)
    assert [(r.stage, r.last_snapshot_key) for r in after.ranges] == [
        (RANGE_DONE, [9]),
        (RANGE_DONE, [20]),
    ]


def test_a_chunk_found_to_be_last_on_retry_closes_the_range(store: MetadataStore) -> None:
    add(store)
    store.start_register("orders-lake", 1)
    store.set_ranges("orders-lake", [(None, None)])
    store.record_chunk("orders-lake", 0, [3], 2, 3, False)
    r = store.record_chunk("orders-lake", 0, [3], 2, 3, True)
    assert (r.stage, r.rows_copied) == (RANGE_DONE, 3)


def test_register_again_before_the_snapshot_takes_the_new_cid(store: MetadataStore) -> None:
    add(store)
    store.start_register("orders-lake", 5)
    assert store.start_register("orders-lake", 9).init_snapshot_version == 9


def test_stages_only_move_forward(store: MetadataStore) -> None:
    add(store)
    with pytest.raises(MetadataError, match="not registered"):
        store.set_ranges("orders-lake", [(None, None)])
    with pytest.raises(MetadataError, match="not in the snapshot stage"):
        store.record_chunk("orders-lake", 0, [1], 1, 1, False)
    with pytest.raises(MetadataError, match="not in the incremental stage"):
        store.record_log_position("orders-lake", 5)
    store.start_register("orders-lake", 5)
    with pytest.raises(MetadataError, match="no snapshot ranges yet"):
        store.finish_snapshot("orders-lake")
    store.set_ranges("orders-lake", [(None, [10]), ([10], None)])
    # Back to register, or new ranges, would lose the copy made so far.
    with pytest.raises(MetadataError, match="restart_snapshot"):
        store.start_register("orders-lake", 6)
    with pytest.raises(MetadataError, match="restart_snapshot"):
        store.set_ranges("orders-lake", [(None, None)])
    with pytest.raises(MetadataError, match="no snapshot range 2"):
        store.record_chunk("orders-lake", 2, [1], 6, 1, False)
    with pytest.raises(MetadataError, match="no snapshot range -1"):
        store.record_chunk("orders-lake", -1, [1], 6, 1, False)
    store.record_chunk("orders-lake", 0, [9], 6, 9, True)
    with pytest.raises(MetadataError, match="range 0 is already done"):
        store.record_chunk("orders-lake", 0, [12], 7, 1, False)
    store.record_chunk("orders-lake", 1, [11], 6, 2, True)
    store.finish_snapshot("orders-lake")
    with pytest.raises(MetadataError, match="not in the snapshot stage"):
        store.record_chunk("orders-lake", 1, [15], 7, 1, True)
    with pytest.raises(MetadataError, match="restart_snapshot"):
        store.start_register("orders-lake", 99)
    # The failed calls changed nothing.
    p = store.progress("orders-lake")
    assert (p.stage, p.init_snapshot_version, p.last_log_index, p.rows_copied) == (
        STAGE_INCREMENTAL,
        5,
        5,
        11,
    )


def test_restart_snapshot_is_the_one_way_back(store: MetadataStore) -> None:
    add(store)
    to_incremental(store, init_cid=10)
    store.record_log_position("orders-lake", 50)
    for _ in range(2):  # retry-safe too
        p = store.restart_snapshot("orders-lake", 80)
    assert (p.stage, p.init_snapshot_version, p.last_log_index, p.ranges) == (
        STAGE_REGISTER,
        80,
        None,
        (),
    )
    store.set_ranges("orders-lake", [(None, None)])
    assert store.progress("orders-lake").ranges[0].init_snapshot_version == 80


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.start_register("orders-lake", -1),
        lambda s: s.start_register("orders-lake", "5"),
        lambda s: s.record_log_position("orders-lake", True),
    ],
)
def test_bad_cids_are_rejected(
    store: MetadataStore, call: Callable[[MetadataStore], object]
) -> None:
    add(store)
    with pytest.raises(MetadataError, match="must be a cid"):
        call(store)


def test_keys_must_be_json(store: MetadataStore) -> None:
    add(store)
    store.start_register("orders-lake", 1)
    with pytest.raises(MetadataError, match="not a JSON value"):
        store.set_ranges("orders-lake", [(None, [b"\x00"])])
    with pytest.raises(MetadataError, match="at least one range"):
        store.set_ranges("orders-lake", [])
    assert store.progress("orders-lake").stage == STAGE_REGISTER


# --- persistence, owners, concurrency -------------------------------------------------------


def test_close_and_reopen_keeps_the_state(open_store: Callable[..., MetadataStore]) -> None:
    first = open_store()
    add(first, options={"page_rows": 5000})
    first.start_register("orders-lake", 3)
    first.set_ranges("orders-lake", [(None, [7]), ([7], None)])
    first.record_chunk("orders-lake", 0, [6], 4, 6, True)
    first.record_chunk("orders-lake", 1, [8], 4, 1, False)
    first.request_cancel("orders-lake")
    sub, progress = first.get_subscription("orders-lake"), first.progress("orders-lake")
    first.close()
    first.close()  # closing twice is harmless
    with pytest.raises(MetadataError, match="closed"):
        first.progress("orders-lake")

    second = open_store()  # the schema exists already: opening again is idempotent
    assert second.get_subscription("orders-lake") == sub
    assert second.progress("orders-lake") == progress
    # and it resumes from there
    second.record_chunk("orders-lake", 1, [9], 5, 1, True)
    assert second.finish_snapshot("orders-lake").stage == STAGE_INCREMENTAL


def test_two_owners_share_one_store(open_store: Callable[..., MetadataStore]) -> None:
    server_a = open_store(owner="a")
    server_b = open_store(owner="b")
    add(server_a, "sa")  # owner taken from the store
    add(server_b, "sb")
    assert [s.name for s in server_a.list_subscriptions(owner="a")] == ["sa"]
    assert [s.name for s in server_b.list_subscriptions(owner="b")] == ["sb"]
    to_incremental(server_a, "sa", init_cid=10)
    server_b.start_register("sb", 20)
    server_a.record_log_position("sa", 30)
    # Neither can move the other's progress, cancel or remove it.
    for call in (
        lambda: server_b.record_log_position("sa", 99),
        lambda: server_b.restart_snapshot("sa", 1),
        lambda: server_b.request_cancel("sa"),
        lambda: server_b.remove_subscription("sa"),
        lambda: server_a.set_ranges("sb", [(None, None)]),
    ):
        with pytest.raises(MetadataError, match="belongs to owner"):
            call()
    assert server_b.progress("sa").last_log_index == 30
    assert server_a.progress("sb").stage == STAGE_REGISTER
    # A store opened without an owner (the CLI) may act on any subscription.
    admin = open_store()
    assert admin.request_cancel("sb").cancel
    assert [s.name for s in server_b.list_subscriptions(owner="b", include_cancelled=True)] == [
        "sb"
    ]


def test_one_run_per_owner(open_store: Callable[..., MetadataStore]) -> None:
    """Pipeline QA: two `pipeline run` of one owner raced on its progress — each moved the
    source's hold past the other's position, the other re-copied the whole table, over
    and over. A run claims its owner; a second is refused, saying who holds it."""
    first = open_store(owner="a")
    first.claim_owner()
    second = open_store(owner="a")
    with pytest.raises(MetadataError) as refused:
        second.claim_owner()
    message = str(refused.value)
    assert message.startswith("another `litecdc pipeline run` of owner 'a' is running"), message
    assert f"(pid {os.getpid()} on " in message and "with another --owner" in message, message
    open_store(owner="b").claim_owner()  # another owner runs alongside
    first.check_owner_claim()  # still held
    first.close()  # (a process that ends, kill -9 too, lets go the same way)
    second.claim_owner()
    with pytest.raises(MetadataError, match="needs a store opened for an owner"):
        open_store().claim_owner()


def test_a_run_that_lost_its_postgresql_claim_takes_it_again_or_stops(
    postgresql_db_url: str,
) -> None:
    """PostgreSQL drops an advisory lock with its connection (a restarted server): the
    run takes it again at its next check, or fails if another run took it meanwhile."""
    dbname = postgresql_db_url.rsplit("/", 1)[1]
    admin_url = postgresql_db_url.rsplit("/", 1)[0] + "/postgres"

    def drop_run_lock_connections() -> None:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(  # (and wait for them to end: PostgreSQL 14's timeout form)
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name LIKE 'litecdc-run %%'",
                [dbname],
            )

    with (
        MetadataStore.open(postgresql_db_url, owner="a") as run,
        MetadataStore.open(postgresql_db_url, owner="a") as other,
    ):
        run.claim_owner()
        drop_run_lock_connections()
        run.check_owner_claim()  # taken again
        with pytest.raises(MetadataError, match="another `litecdc pipeline run` of owner 'a'"):
            other.claim_owner()
        drop_run_lock_connections()
        other.claim_owner()  # took it while the run's connection was gone
        with pytest.raises(MetadataError, match="another `litecdc pipeline run` of owner 'a'"):
            run.check_owner_claim()


def test_a_store_connection_the_server_ended_is_connected_again(postgresql_db_url: str) -> None:
    """QA: pg_terminate_backend of the store's connection (the server up all along; a
    restart alike) failed the next call, and that ended `pipeline run`. A connection
    found ended when a transaction begins is connected again, once, before anything
    ran; a server down stays an error."""
    dbname = postgresql_db_url.rsplit("/", 1)[1]
    admin_url = postgresql_db_url.rsplit("/", 1)[0] + "/postgres"
    with MetadataStore.open(postgresql_db_url, owner="a") as store:
        add(store, name="kept")
        with psycopg.connect(admin_url, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name = 'litecdc-pipeline'",
                [dbname],
            ).fetchall()
        assert ended == [(True,)]
        assert store.get_subscription("kept").name == "kept"
        assert [s.name for s in store.list_subscriptions()] == ["kept"]


def test_a_run_refuses_no_one_with_its_own_session_left_on_the_server(
    postgresql_db_url: str,
) -> None:
    """Review: when the claim's connection broke on the run's side only (a partition), the
    server kept its session and lock, and the run, taking the lock again, refused itself
    (naming its own pid). It ends its own earlier session and goes on."""
    with MetadataStore.open(postgresql_db_url, owner="a") as run:
        run.claim_owner()
        backend = run._backend
        assert isinstance(backend, metadata._PostgresBackend)
        earlier = backend._claim_conn
        # as a partition: this side's socket is replaced by a dead one, while the
        # connection stays open in the kernel (no FIN): the server's session lives on
        fd = earlier.pgconn.socket
        kept = os.dup(fd)
        with socket.socket() as dead:
            os.dup2(dead.fileno(), fd)
        try:
            run.check_owner_claim()  # took it again (was: "another `litecdc pipeline run`")
        finally:
            os.close(kept)
        assert backend._claim_conn is not earlier
        with (
            MetadataStore.open(postgresql_db_url, owner="a") as other,
            pytest.raises(MetadataError, match=f"pid {os.getpid()} on "),
        ):
            other.claim_owner()


def test_a_sqlite_store_removed_under_a_run_stops_it(tmp_path: Path) -> None:
    """QA: a run went on writing into the deleted store file (unseen by `status`), while a
    new `subscribe` made another store that no run would read."""
    url = sqlite_url(tmp_path / "meta.db")
    with MetadataStore.open(url, owner="a") as run:
        add(run)
        run.claim_owner()
        run.check_owner_claim()  # (the store as it opened)
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / f"meta.db{suffix}").unlink(missing_ok=True)
        with pytest.raises(MetadataError, match="was removed or replaced while this run used it"):
            run.check_owner_claim()
        with MetadataStore.open(url) as new:  # another store made there meanwhile
            add(new, name="other")
        with pytest.raises(MetadataError, match="was removed or replaced while this run used it"):
            run.check_owner_claim()


def test_a_sqlite_run_lock_removed_or_linked_is_still_one_run(tmp_path: Path) -> None:
    """Review: a run file deleted while held let a second run lock a new one, and a
    symbolic link to the store named another run file."""
    url = sqlite_url(tmp_path / "meta.db")
    with MetadataStore.open(url, owner="a") as first:
        first.claim_owner()
        (tmp_path / "alias.db").symlink_to(tmp_path / "meta.db")
        with (
            MetadataStore.open(sqlite_url(tmp_path / "alias.db"), owner="a") as aliased,
            pytest.raises(MetadataError, match="another `litecdc pipeline run` of owner 'a'"),
        ):
            aliased.claim_owner()
        (run_file,) = tmp_path.glob("meta.db.run-*.lock")
        assert run_file.stat().st_mode & 0o777 == 0o600
        run_file.unlink()  # (it looks stale)
        first.check_owner_claim()  # takes the new file
        with (
            MetadataStore.open(url, owner="a") as second,
            pytest.raises(MetadataError, match="another `litecdc pipeline run` of owner 'a'"),
        ):
            second.claim_owner()
        run_file.unlink()
        with MetadataStore.open(url, owner="a") as second:
            second.claim_owner()  # a second run came first this time: the first one stops
            with pytest.raises(MetadataError, match="another `litecdc pipeline run`"):
                first.check_owner_claim()


def test_concurrent_writers_do_not_lose_updates(open_store: Callable[..., MetadataStore]) -> None:
    """Two store objects (two processes' worth) recording chunks of one subscription."""
    setup = open_store()
    add(setup)
    setup.start_register("orders-lake", 1)
    setup.set_ranges("orders-lake", [(None, [1000]), ([1000], None)])
    stores = [open_store(), open_store()]
    errors: list[BaseException] = []

    def copy(range_id: int) -> None:
        try:
            for i in range(25):
                stores[range_id].record_chunk(
                    "orders-lake", range_id, [range_id * 1000 + i], 2 + i, 10, i == 24
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=copy, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    p = setup.progress("orders-lake")
    assert p.snapshot_done and p.rows_copied == 500


# --- URLs and connection errors -------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        ("mysql://root@127.0.0.1/meta", "unsupported metadata URL"),
        ("/tmp/meta.db", "unsupported metadata URL"),
        ("sqlite://", "names no file"),
        ("sqlite:///no/such/dir/meta.db", "directory /no/such/dir does not exist"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(MetadataError, match=message):
        MetadataStore.open(url)


def test_sqlite_relative_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with MetadataStore.open("sqlite:meta.db") as store:
        add(store)
    assert (tmp_path / "meta.db").exists()
    with MetadataStore.open(sqlite_url(tmp_path / "meta.db")) as store:
        assert store.get_subscription("orders-lake").table_name == "orders"


def test_a_new_sqlite_store_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """Security QA: it holds sources' and sinks' passwords in clear, and was made 0644."""
    with MetadataStore.open(sqlite_url(tmp_path / "meta.db")) as store:
        add(store)
        for made in tmp_path.glob("meta.db*"):  # the -wal and -shm files too
            assert made.stat().st_mode & 0o777 == 0o600, made
    premade = tmp_path / "premade.db"  # config QA: an empty file given stayed 0644
    premade.touch(mode=0o644)
    premade.chmod(0o644)
    with MetadataStore.open(sqlite_url(premade)) as store:
        add(store)
        for made in tmp_path.glob("premade.db*"):
            assert made.stat().st_mode & 0o777 == 0o600, made


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "meta.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(MetadataError, match=r"meta\.db"):
        MetadataStore.open(sqlite_url(tmp_path / "meta.db"))


def test_unreachable_postgresql_fails_without_leaking_the_password() -> None:
    url = f"postgresql://litecdc:s3cret@127.0.0.1:{free_port()}/meta"
    with pytest.raises(MetadataError, match="cannot connect to the metadata database") as err:
        MetadataStore.open(url, connect_timeout=2)
    assert "s3cret" not in str(err.value)
    assert isinstance(err.value.__cause__, psycopg.OperationalError)


def test_unknown_postgresql_database(postgresql_url: str) -> None:
    url = postgresql_url.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(MetadataError, match="no_such_database") as err:
        MetadataStore.open(url)
    assert str(err.value).endswith("(create that database, or fix its name in the URL)")


def test_a_server_refusing_more_connections_is_said_so(postgresql_db_url: str) -> None:
    """QA: "too many clients" came with "is the server running and the URL right?"."""
    role = f"limited_{os.getpid()}_{threading.get_ident() % 10_000}"
    with psycopg.connect(postgresql_db_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 0")
    try:
        host_db = postgresql_db_url.split("@", 1)[1]
        with pytest.raises(MetadataError, match="too many connections for role") as err:
            MetadataStore.open(f"postgresql://{role}:pw@{host_db}", connect_timeout=2)
        assert str(err.value).endswith(
            "(the user's connection limit is reached: end its idle clients or raise the limit)"
        )
    finally:
        with psycopg.connect(postgresql_db_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")


def test_a_store_opens_for_reading_with_a_role_that_may_only_read(postgresql_db_url: str) -> None:
    """Metadata QA: `status`, `list` and `verify` open the store without creating it, yet
    opening ran CREATE TABLE IF NOT EXISTS in a write transaction: a role granted SELECT
    only was refused ("permission denied for schema public"). A store that has every
    table at this version is opened without a write."""
    with MetadataStore.open(postgresql_db_url) as store:
        add(store)
    role = f"reader_{os.getpid()}_{threading.get_ident() % 10_000}"
    with psycopg.connect(postgresql_db_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        admin.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        host_db = postgresql_db_url.split("@", 1)[1]
        with MetadataStore.open(f"postgresql://{role}:pw@{host_db}", create=False) as reader:
            assert [sub.name for sub in reader.list_subscriptions()] == ["orders-lake"]
            with pytest.raises(MetadataError, match="permission denied"):
                add(reader, "another")
    finally:
        with psycopg.connect(postgresql_db_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_a_sqlite_store_opens_for_reading_beside_a_writer_holding_its_lock(
    tmp_path: Path,
) -> None:
    """Metadata QA: with another client in a write transaction of a SQLite store, `status`
    waited out the busy timeout (30 s) and failed: opening wrote (CREATE TABLE IF NOT
    EXISTS). Reading needs no lock in WAL mode, and now opening writes nothing either."""
    url = sqlite_url(tmp_path / "meta.db")
    with MetadataStore.open(url) as store:
        add(store)
    writer = sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        with MetadataStore.open(url, create=False, busy_timeout=0.5) as reader:
            assert [sub.name for sub in reader.list_subscriptions()] == ["orders-lake"]
    finally:
        writer.close()


def test_a_lock_another_client_holds_on_the_store_is_said_so(
    postgresql_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metadata QA: a table lock another client held was reported as "no answer within
    30 s (its connection was broken …)", as if the server had frozen."""
    monkeypatch.setattr(metadata, "LOCK_WAIT", 0.5)
    with MetadataStore.open(postgresql_db_url) as store:
        add(store)
        with psycopg.connect(postgresql_db_url) as other:
            other.execute("LOCK TABLE litecdc_subscriptions IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(MetadataError) as err:
                store.list_subscriptions()
            assert "another client of the database has held a lock on the store's tables " in (
                str(err.value)
            )
            assert str(err.value).endswith(
                "(canceling statement due to lock timeout): end its transaction "
                "(pg_stat_activity and pg_locks show it)"
            )
            assert "LINE 1" not in str(err.value)  # (the server's statement fragment: QA)
        assert [sub.name for sub in store.list_subscriptions()] == ["orders-lake"]


def test_redact_url() -> None:
    assert redact_url("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_postgresql_connection_loss_recovers_on_the_next_call(postgresql_db_url: str) -> None:
    with MetadataStore.open(postgresql_db_url) as store:
        add(store)
        dbname = postgresql_db_url.rsplit("/", 1)[1]
        admin_url = postgresql_db_url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [dbname],
            )
        # The call that finds the connection dead fails clearly; the next one reconnects.
        try:
            store.get_subscription("orders-lake")
        except MetadataError as exc:
            assert "metadata database" in str(exc)
        assert store.get_subscription("orders-lake").table_name == "orders"


def test_a_frozen_postgresql_store_fails_a_call_after_the_deadline_not_never(
    postgresql_server: LocalServer, postgresql_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QA: a frozen metadata server (SIGSTOP) hung `pipeline run` and `status` for good,
    SIGTERM included: a transaction now gives up after TRANSACTION_DEADLINE."""
    monkeypatch.setattr(metadata, "TRANSACTION_DEADLINE", 2.0)
    with MetadataStore.open(postgresql_db_url) as store:
        add(store)
        with postgresql_server.frozen():
            outcome: list[BaseException | object] = []

            def call() -> None:
                try:
                    outcome.append(store.get_subscription("orders-lake"))
                except BaseException as exc:
                    outcome.append(exc)

            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            caller.join(15)
            assert not caller.is_alive()
            (error,) = outcome
            assert isinstance(error, MetadataError)
            assert "no answer within 2 s (its connection was broken" in str(error)
        # the server answers again: the next call connects again
        assert store.get_subscription("orders-lake").table_name == "orders"


# --- state kept by `pipeline run` -------------------------------------------------------------


def test_mirrored_spec_and_failure_are_kept_and_removed_with_the_subscription(
    store: MetadataStore, open_store: Callable[..., MetadataStore]
) -> None:
    add(store)
    assert store.mirrored_spec("orders-lake") is None
    assert store.failure("orders-lake") is None
    spec = {"table": "orders", "columns": [{"name": "id", "arrow": "int64"}], "key": ["id"]}
    store.set_mirrored_spec("orders-lake", spec)
    store.set_failure("orders-lake", "sink down")
    again = open_store()  # another process sees both
    assert again.mirrored_spec("orders-lake") == spec
    failure = again.failure("orders-lake")
    assert failure is not None and failure[0] == "sink down"
    store.set_failure("orders-lake", "sink still down")  # the first failure's time stays
    assert again.failure("orders-lake") == ("sink still down", failure[1])
    store.set_failure("orders-lake", None)
    assert again.failure("orders-lake") is None
    assert again.mirrored_spec("orders-lake") == spec  # clearing the error keeps the spec
    with pytest.raises(MetadataError, match="unknown subscription"):
        store.set_failure("nope", "x")
    store.remove_subscription("orders-lake")
    add(store)  # the same name again starts clean
    assert store.mirrored_spec("orders-lake") is None
