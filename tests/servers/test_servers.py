"""One smoke test per throwaway server, each through the client litecdc's sinks use."""

from __future__ import annotations

import asyncio
import uuid

import pika
import psycopg
import pymysql
import pytest
from nats.aio.client import Client as NATS

from litecdc.localservers.process import ServerUnavailableError, find_binary


def test_postgresql_session_and_fresh_database(postgresql_url: str, postgresql_db_url: str) -> None:
    assert postgresql_url.startswith("postgresql://postgres@127.0.0.1:")
    assert postgresql_url.endswith("/litecdc")
    with psycopg.connect(postgresql_db_url) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'one')")
        assert conn.execute("SELECT v FROM t").fetchone() == ("one",)
    # The fresh database is not the shared one.
    with psycopg.connect(postgresql_url) as conn:
        assert conn.execute("SELECT to_regclass('t')").fetchone() == (None,)


def test_mariadb(mariadb_url: str) -> None:
    assert mariadb_url.startswith("mysql://root@127.0.0.1:")
    host_port, dbname = mariadb_url.removeprefix("mysql://root@").split("/")
    host, port = host_port.split(":")
    conn = pymysql.connect(host=host, port=int(port), user="root", database=dbname)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS smoke (id BIGINT PRIMARY KEY, v TEXT)")
            cur.execute("REPLACE INTO smoke VALUES (1, 'one')")
            cur.execute("SELECT v FROM smoke WHERE id = 1")
            assert cur.fetchone() == ("one",)
        conn.commit()
    finally:
        conn.close()


def test_nats_jetstream_publish_and_consume(nats_url: str) -> None:
    async def roundtrip() -> list[bytes]:
        nc = NATS()
        await nc.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            stream = f"S{uuid.uuid4().hex[:8]}"
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
            for i in range(3):
                ack = await js.publish(
                    f"{stream}.x", f"m{i}".encode(), headers={"Nats-Msg-Id": str(i)}
                )
                assert ack.stream == stream
            # A duplicate message id is dropped by JetStream (what the sink's dedupe relies on).
            dup = await js.publish(f"{stream}.x", b"m0", headers={"Nats-Msg-Id": "0"})
            assert dup.duplicate
            sub = await js.pull_subscribe(f"{stream}.>", durable="smoke")
            msgs = await sub.fetch(3, timeout=5)
            for m in msgs:
                await m.ack()
            return [m.data for m in msgs]
        finally:
            await nc.close()

    assert asyncio.run(roundtrip()) == [b"m0", b"m1", b"m2"]


def test_rabbitmq_publish_and_get(rabbitmq_url: str) -> None:
    assert rabbitmq_url.startswith("amqp://guest:guest@127.0.0.1:")
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = f"smoke-{uuid.uuid4().hex[:8]}"
        ch.queue_declare(queue=queue, durable=True)
        ch.basic_publish(exchange="", routing_key=queue, body=b"hello")
        method, _props, body = ch.basic_get(queue=queue, auto_ack=True)
        assert method is not None
        assert body == b"hello"
    finally:
        conn.close()


def test_a_missing_binary_says_to_run_make_test() -> None:
    with pytest.raises(ServerUnavailableError, match=r"not installed .*run `make test`"):
        find_binary(["no-such-server-binary"], "Some server", ["/nonexistent/*/bin/x"])
