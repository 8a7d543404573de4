"""The etcd client against real etcd: keys, txn guards, leases, watches, failover, TLS, auth."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from etcd_cluster import EtcdCluster, EtcdMember, free_port
from fakes import make_certs
from pyetcd import etcdrpc

from litecdc.cluster import (
    CompactedError,
    Compare,
    Delete,
    EtcdAuthError,
    EtcdClient,
    EtcdSettings,
    EtcdUnavailableError,
    Get,
    Put,
)
from litecdc.cluster.election import leader_key
from litecdc.cluster.log import log_key
from litecdc.cluster.node import Member
from litecdc.cluster.snapshot import LogCompactor, SnapshotSettings
from litecdc.errors import ConfigError


def put_retrying(client: EtcdClient, key: str, value: bytes, timeout: float = 10) -> None:
    """A write after a member died may time out once more while the others elect a new
    raft leader (the client does not retry writes: a timed-out one may have happened)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.put(key, value)
            return
        except EtcdUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_put_get_delete_and_prefix_ranges(client: EtcdClient, cluster_name: str) -> None:
    p = f"/{cluster_name}/"
    first = client.put(p + "b", b"2")
    second = client.put(p + "a", b"1")
    assert second == first + 1
    client.put(p + "c", b"3")
    kv = client.get(p + "a")
    assert kv is not None and kv.value == b"1" and kv.create_revision == second
    assert client.get(p + "missing") is None

    everything = client.range(p, prefix=True)
    assert [kv.key for kv in everything.kvs] == [p + "a", p + "b", p + "c"]
    assert everything.revision >= second + 1
    limited = client.range(p, prefix=True, limit=2)
    assert len(limited.kvs) == 2 and limited.more

    assert client.delete(p + "a") == 1
    assert client.delete(p, prefix=True) == 2
    assert client.range(p, prefix=True).kvs == []


def test_txn_compares_on_revisions_version_and_value(client: EtcdClient, cluster_name: str) -> None:
    key = f"/{cluster_name}/leader"
    created = client.txn([Compare.absent(key)], [Put(key, b"n1")], [Get(key)])
    assert created.succeeded and created.ranges == [[]]
    fence = created.revision

    again = client.txn([Compare.absent(key)], [Put(key, b"n2")], [Get(key)])
    assert not again.succeeded
    assert [kv.value for kv in again.ranges[0]] == [b"n1"]
    assert again.ranges[0][0].create_revision == fence

    log_key = f"/{cluster_name}/log/1"
    guarded = client.txn([Compare.created_at(key, fence)], [Put(log_key, b"entry")])
    assert guarded.succeeded and guarded.revision == fence + 1
    stale = client.txn([Compare.created_at(key, fence - 1)], [Put(log_key, b"late")])
    assert not stale.succeeded
    assert client.get(log_key) is not None and client.get(log_key).value == b"entry"  # type: ignore[union-attr]

    assert client.txn([Compare(log_key, "mod_revision", "==", fence + 1)]).succeeded
    assert client.txn([Compare(log_key, "version", "==", 1)]).succeeded
    assert client.txn([Compare(log_key, "version", ">", 0)]).succeeded
    assert not client.txn([Compare(log_key, "version", "<", 1)]).succeeded
    assert client.txn([Compare(log_key, "value", "==", b"entry")]).succeeded
    assert client.txn([Compare(log_key, "value", "!=", b"other")]).succeeded

    both = client.txn([], [Delete(f"/{cluster_name}/", prefix=True), Get(key)])
    assert both.succeeded and both.ranges == [[], []]


def test_large_ranges_pass_the_raised_grpc_limit(client: EtcdClient, cluster_name: str) -> None:
    value = b"x" * (1024 * 1024)
    for i in range(6):  # 6 MiB in one response: over gRPC's default 4 MiB
        client.put(f"/{cluster_name}/big/{i}", value)
    result = client.range(f"/{cluster_name}/big/", prefix=True)
    assert len(result.kvs) == 6 and all(kv.value == value for kv in result.kvs)
    client.delete(f"/{cluster_name}/", prefix=True)


@pytest.mark.slow
def test_lease_keeps_keys_while_refreshed_and_expires_them_after(
    client: EtcdClient, cluster_name: str
) -> None:
    key = f"/{cluster_name}/member"
    lease = client.grant_lease(2)
    assert lease.ttl == 2
    client.put(key, b"alive", lease=lease.id)
    assert client.get(key).lease == lease.id  # type: ignore[union-attr]
    for _ in range(4):  # 2.8 s > TTL: kept alive
        time.sleep(0.7)
        assert client.keepalive(lease.id) == 2
    assert client.get(key) is not None
    deadline = time.monotonic() + 5
    while client.get(key) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.get(key) is None
    assert client.lease_ttl(lease.id) == -1
    assert client.keepalive(lease.id) == 0


def test_revoking_a_lease_deletes_its_keys(client: EtcdClient, cluster_name: str) -> None:
    key = f"/{cluster_name}/member"
    lease = client.grant_lease(30)
    client.put(key, b"x", lease=lease.id)
    client.revoke_lease(lease.id)
    assert client.get(key) is None
    client.revoke_lease(lease.id)  # already gone: not an error


def test_watch_from_a_revision_delivers_every_change_in_order(
    client: EtcdClient, cluster_name: str
) -> None:
    p = f"/{cluster_name}/log/"
    start = client.put(p + "1", b"a")
    client.txn([], [Put(p + "2", b"b"), Put(p + "3", b"c")])
    client.delete(p + "1")
    with client.watch(p, prefix=True, start_revision=start) as watch:
        seen: list[tuple[str, str, bytes]] = []
        while len(seen) < 4:
            batch = watch.get(timeout=5)
            assert batch is not None
            seen += [(e.type, e.kv.key, e.kv.value) for e in batch.events]
        assert seen == [
            ("put", p + "1", b"a"),
            ("put", p + "2", b"b"),
            ("put", p + "3", b"c"),
            ("delete", p + "1", b""),
        ]
        later = client.put(p + "4", b"d")
        batch = watch.get(timeout=5)
        assert batch is not None and batch.revision == later
        assert [e.kv.mod_revision for e in batch.events] == [later]
        watch.request_progress()
        progress = watch.get(timeout=5)
        assert progress is not None and progress.events == [] and progress.revision >= later
    assert watch.get(timeout=0.1) is None  # cancelled


def test_a_txn_arrives_as_one_watch_batch(client: EtcdClient, cluster_name: str) -> None:
    p = f"/{cluster_name}/log/"
    with client.watch(p, prefix=True) as watch:
        revision = client.txn([], [Put(f"{p}{i:03}", b"e") for i in range(100)]).revision
        batch = watch.get(timeout=5)
        assert batch is not None and len(batch.events) == 100
        assert {e.kv.mod_revision for e in batch.events} == {revision}


def test_watching_a_compacted_revision_raises_compacted_error(
    client: EtcdClient, cluster_name: str
) -> None:
    key = f"/{cluster_name}/k"
    first = client.put(key, b"1")
    for i in range(3):
        client.put(key, str(i).encode())
    last = client.put(key, b"end")
    client.compact(last)
    client.compact(last - 1)  # already compacted further: a no-op
    watch = client.watch(key, start_revision=first)
    with pytest.raises(CompactedError) as raised:  # (a timeout returns None)
        watch.get(timeout=5)
    assert raised.value.compact_revision == last
    assert "compacted" in str(raised.value)
    with pytest.raises(CompactedError):  # stays failed
        watch.get(timeout=1)
    watch.cancel()
    with pytest.raises(CompactedError):
        client.range(key, revision=first)
    with client.watch(key, start_revision=last) as fine:
        batch = fine.get(timeout=5)
        assert batch is not None and batch.events[0].kv.value == b"end"


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="no endpoint"):
        EtcdClient(EtcdSettings(endpoints=[]))
    with pytest.raises(ConfigError, match="host:port"):
        EtcdClient(EtcdSettings(endpoints=["localhost"]))
    with pytest.raises(ConfigError, match="certificate and its key"):
        EtcdClient(EtcdSettings(endpoints=["127.0.0.1:2379"], client_cert="c.pem"))
    with pytest.raises(ConfigError, match="user and the password"):
        EtcdClient(EtcdSettings(endpoints=["127.0.0.1:2379"], user="root"))


def test_unreachable_etcd_is_a_clear_error_and_failover_skips_it(etcd: EtcdCluster) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with (
        EtcdClient(EtcdSettings(endpoints=[dead], request_timeout=1.0)) as alone,
        pytest.raises(EtcdUnavailableError, match="did not answer"),
    ):
        alone.put("/x", b"1")
    with EtcdClient(EtcdSettings(endpoints=[dead, *etcd.endpoints], request_timeout=1.0)) as c:
        assert c.get("/no-such-key") is None  # a read retries on the next member
        assert c.current_endpoint == etcd.endpoints[0]
        c.put("/failover", b"ok")
        c.delete("/failover")


@pytest.mark.slow
def test_a_paused_member_is_skipped_after_one_timeout(etcd3: EtcdCluster) -> None:
    settings = EtcdSettings(endpoints=etcd3.endpoints, request_timeout=1.0, retry_after=30)
    with EtcdClient(settings) as c:
        first = c.put("/k", b"1")
        assert c.current_endpoint == etcd3.members[0].endpoint
        etcd3.members[0].pause()
        try:
            with pytest.raises(EtcdUnavailableError):
                c.put("/k", b"2")  # a write is not retried: it may have happened
            put_retrying(c, "/k", b"3")  # the next member
            kv = c.get("/k")
            assert kv is not None and kv.value == b"3"
            # every value the key held since: "2" was not sent again to another member
            # (CI: counting versions failed when a timed-out "3" had been applied too,
            # and put_retrying sent it again)
            held = {
                bytes(found.kvs[0].value)
                for revision in range(first, kv.mod_revision + 1)
                if (found := c.range("/k", revision=revision)).kvs
            }
            assert held == {b"1", b"3"}
            assert c.current_endpoint != etcd3.members[0].endpoint
        finally:
            etcd3.members[0].resume()


@pytest.mark.slow
def test_a_watch_on_a_killed_member_fails_with_unavailable(etcd3: EtcdCluster) -> None:
    settings = EtcdSettings(endpoints=etcd3.endpoints, request_timeout=1.0)
    with EtcdClient(settings) as c:
        watch = c.watch("/w", start_revision=0)
        c.put("/w", b"1")
        assert watch.get(timeout=5) is not None
        etcd3.members[0].kill()
        with pytest.raises(EtcdUnavailableError):
            watch.get(timeout=10)
        watch.cancel()
        put_retrying(c, "/w", b"2")  # failed over
        assert c.current_endpoint != etcd3.members[0].endpoint
        with c.watch("/w", start_revision=1) as again:
            values = []
            while len(values) < 2:
                batch = again.get(timeout=5)
                assert batch is not None
                values += [e.kv.value for e in batch.events]
            assert values == [b"1", b"2"]


@pytest.mark.slow
def test_tls_with_client_certificates(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    with EtcdCluster(tmp_path / "etcd", size=1, tls=certs) as cluster:
        settings = EtcdSettings(
            endpoints=cluster.endpoints,
            ca_cert=certs.ca_cert,
            client_cert=certs.client_cert,
            client_key=certs.client_key,
            request_timeout=2.0,
        )
        with EtcdClient(settings) as c:
            c.put("/tls", b"yes")
            with c.watch("/tls", start_revision=1) as watch:
                batch = watch.get(timeout=5)
                assert batch is not None and batch.events[0].kv.value == b"yes"
        without_cert = EtcdSettings(
            endpoints=cluster.endpoints, ca_cert=certs.ca_cert, request_timeout=2.0
        )
        with EtcdClient(without_cert) as c, pytest.raises(EtcdUnavailableError):
            c.get("/tls")
        plaintext = EtcdSettings(endpoints=cluster.endpoints, request_timeout=2.0)
        with EtcdClient(plaintext) as c, pytest.raises(EtcdUnavailableError):
            c.get("/tls")


def _enable_auth(endpoint: str, password: str) -> None:
    """What ``etcdctl user add root; etcdctl auth enable`` does, through the gRPC API."""
    channel = grpc.insecure_channel(endpoint)
    auth = etcdrpc.AuthStub(channel)
    auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=password), timeout=5)
    auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), timeout=5)
    auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
    auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=5)
    channel.close()


def test_user_and_password(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        _enable_auth(cluster.endpoints[0], "s3cret")
        good = EtcdSettings(endpoints=cluster.endpoints, user="root", password="s3cret")
        with EtcdClient(good) as c:
            c.put("/auth", b"1")
            with c.watch("/auth", start_revision=1) as watch:
                batch = watch.get(timeout=5)
                assert batch is not None and batch.events[0].kv.value == b"1"
            lease = c.grant_lease(5)
            assert c.keepalive(lease.id) == 5
            c.revoke_lease(lease.id)
        wrong = EtcdSettings(endpoints=cluster.endpoints, user="root", password="nope")
        with EtcdClient(wrong) as c, pytest.raises(EtcdAuthError):
            c.get("/auth")
        with (
            EtcdClient(EtcdSettings(endpoints=cluster.endpoints)) as c,
            pytest.raises(EtcdAuthError),
        ):
            c.put("/auth", b"2")
        assert "s3cret" not in repr(good)


def test_concurrent_use_from_threads(client: EtcdClient, cluster_name: str) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(20):
                client.put(f"/{cluster_name}/{n}/{i}", b"v")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(client.range(f"/{cluster_name}/", prefix=True).kvs) == 80


def _db_size(member: EtcdMember) -> int:
    return (member.data_dir / "member" / "snap" / "db").stat().st_size


def _fill_and_free(client: EtcdClient, prefix: str, megabytes: int) -> None:
    """Write ``megabytes`` MiB under ``prefix``, delete it and compact etcd's history: the
    space is free inside etcd's file, which keeps its size until defragmented."""
    value = b"x" * 10_240
    for block in range(megabytes * 1024 // 10 // 100):
        client.txn([], [Put(f"{prefix}{block}/{i}", value) for i in range(100)])
    client.delete(prefix, prefix=True)
    client.compact(client.put(f"{prefix}done", b""), physical=True)


@pytest.mark.slow
def test_defragment_shrinks_every_members_file(tmp_path: Path) -> None:
    with (
        EtcdCluster(tmp_path / "etcd", size=3) as cluster,
        EtcdClient(EtcdSettings(endpoints=cluster.endpoints, request_timeout=5.0)) as c,
    ):
        _fill_and_free(c, "/defrag/", 12)
        before = [_db_size(m) for m in cluster.members]
        assert min(before) > 10 * 1024 * 1024
        current = c.current_endpoint  # defragmented last: requests go there meanwhile
        others = [m.endpoint for m in cluster.members if m.endpoint != current]
        assert c.defragment() == [*others, current]
        # each member applies the compaction in its own time; a member that had not yet
        # freed the pages when asked shrinks on a later defragmentation
        deadline = time.monotonic() + 20
        while True:
            after = [_db_size(m) for m in cluster.members]
            if all(a < b / 4 for a, b in zip(after, before, strict=True)):
                break
            assert time.monotonic() < deadline, (before, after)
            time.sleep(0.5)
            c.defragment()
        c.put("/defrag/after", b"still works")
        assert (kv := c.get("/defrag/after")) is not None and kv.value == b"still works"


def test_defragment_tries_every_member_and_reports_one_that_failed(etcd: EtcdCluster) -> None:
    dead = f"127.0.0.1:{free_port()}"
    settings = EtcdSettings(endpoints=[dead, etcd.endpoints[0]], request_timeout=2.0)
    with EtcdClient(settings) as c:
        with pytest.raises(EtcdUnavailableError, match=dead):
            c.defragment()
        assert c.get("/nothing") is None  # the live member was defragmented and still answers


class CountingClient(EtcdClient):
    """A real client that counts its defragmentations."""

    defragments = 0

    def defragment(self, *, timeout: float = 60.0) -> list[str]:
        self.defragments += 1
        return super().defragment(timeout=timeout)


def test_the_compactor_defragments_occasionally(tmp_path: Path) -> None:
    cluster = "defrag"
    with (
        EtcdCluster(tmp_path / "etcd", size=1) as etcd,
        CountingClient(EtcdSettings(endpoints=etcd.endpoints, request_timeout=5.0)) as c,
    ):
        fence = c.put(leader_key(cluster), b"{}")
        last_cid = 0

        def append(n: int) -> None:
            nonlocal last_cid
            for _ in range(n):
                last_cid += 1
                c.put(log_key(cluster, last_cid), b"entry")

        def members() -> list[Member]:
            revision = c.range("/", limit=1, keys_only=True).revision
            return [Member("n1", "", "leader", last_cid, revision + 1)]

        def compactor(every: int, keys: int) -> LogCompactor:
            settings = SnapshotSettings(keep_entries=2, defragment_every=every,
                                        defragment_keys=keys)  # fmt: skip
            return LogCompactor(c, cluster, "n1", members, lambda: True, lambda: last_cid,
                                lambda: fence, settings)  # fmt: skip

        by_count = compactor(every=3, keys=0)
        results = []
        for _ in range(7):
            append(4)
            results.append(by_count.run_once())
        assert all(r is not None and r.deleted and r.compacted_revision for r in results)
        assert [r.defragmented for r in results if r is not None] == [
            False, False, True, False, False, True, False,
        ]  # fmt: skip
        assert by_count.defragmentations == c.defragments == 2

        by_keys = compactor(every=0, keys=10)
        c.defragments = 0
        deleted = []
        for _ in range(4):
            append(4)
            result = by_keys.run_once()
            assert result is not None
            deleted.append(result.deleted)
            if result.defragmented:
                break
        assert sum(deleted) >= 10 and c.defragments == 1 == by_keys.defragmentations
        append(4)
        result = by_keys.run_once()
        assert result is not None and result.deleted == 4 and not result.defragmented
