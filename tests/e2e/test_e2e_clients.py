"""Real rqlite clients against litecdc: pyrqlite (DB-API) and sqlalchemy-rqlite."""

from __future__ import annotations

import datetime

import pyrqlite.dbapi2 as dbapi2
import pytest
import sqlalchemy as sa
from litecdc_node import Node
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


def test_pyrqlite_roundtrip(node: Node) -> None:
    conn = dbapi2.connect(host="127.0.0.1", port=node.port)
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE py (id INTEGER PRIMARY KEY, name TEXT, score REAL, data BLOB)")
        cur.execute(
            "INSERT INTO py(name, score, data) VALUES(?, ?, ?)", ("it's", 2.5, b"\x00\xffbin")
        )
        assert cur.lastrowid == 1
        cur.executemany("INSERT INTO py(name) VALUES(?)", [("a",), ("b",)])
        assert cur.rowcount == 2
        cur.execute("SELECT id, name, score, data FROM py ORDER BY id")
        rows = cur.fetchall()
        assert [tuple(r) for r in rows] == [
            (1, "it's", 2.5, b"\x00\xffbin"),
            (2, "a", None, None),
            (3, "b", None, None),
        ]
        assert [d[0] for d in cur.description] == ["id", "name", "score", "data"]
        cur.execute("UPDATE py SET score = 1 WHERE id > ?", (1,))
        assert cur.rowcount == 2
        # pyrqlite returns an UPDATE's RETURNING rows only up to rows_affected (review QA:
        # answered as rqlite 8 does, without it, it returned none)
        cur.execute("UPDATE py SET score = 2 WHERE id > ? RETURNING id", (1,))
        assert sorted(tuple(r) for r in cur.fetchall()) == [(2,), (3,)]
        cur.execute("INSERT INTO py(name) VALUES(?) RETURNING id", ("c",))
        assert [tuple(r) for r in cur.fetchall()] == [(4,)]
        cur.execute("DELETE FROM py WHERE id = 4 RETURNING name")
        assert [tuple(r) for r in cur.fetchall()] == [("c",)]
        cur.execute("SELECT name FROM py WHERE name = :n", {"n": "b"})
        assert [tuple(r) for r in cur.fetchall()] == [("b",)]
        # pyrqlite 2.2.3 raises its base Error with the result entry as JSON
        with pytest.raises(dbapi2.Error, match='"error": "no such table: nope"'):
            cur.execute("SELECT * FROM nope")
    finally:
        conn.close()


class Base(DeclarativeBase):
    pass


class Person(Base):
    __tablename__ = "person"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(50))
    active: Mapped[bool] = mapped_column(default=True)
    born: Mapped[datetime.date | None]
    seen: Mapped[datetime.datetime | None]
    photo: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    weight: Mapped[float | None]


def test_sqlalchemy_orm_roundtrip(node: Node) -> None:
    # native_datetime: pyrqlite already turns rqlite's DATE values into datetime.date
    engine = sa.create_engine(f"rqlite+pyrqlite://127.0.0.1:{node.port}/", native_datetime=True)
    Base.metadata.create_all(engine)
    seen = datetime.datetime(2026, 9, 30, 12, 34, 56, 789000)
    with Session(engine) as session:
        session.add_all(
            [
                Person(
                    name="fiona",
                    born=datetime.date(1990, 1, 2),
                    seen=seen,
                    photo=b"\x01\x02",
                    weight=61.5,
                ),
                Person(name="declan", active=False),
            ]
        )
        session.commit()
    with Session(engine) as session:
        people = session.scalars(sa.select(Person).order_by(Person.id)).all()
        assert [(p.id, p.name, p.active) for p in people] == [
            (1, "fiona", True),
            (2, "declan", False),
        ]
        fiona = people[0]
        assert fiona.born == datetime.date(1990, 1, 2)
        assert fiona.seen == seen
        assert fiona.photo == b"\x01\x02"
        assert fiona.weight == 61.5
        fiona.name = "fiona b"
        session.delete(people[1])
        session.commit()
    with engine.connect() as conn:
        names = conn.execute(sa.text("SELECT name FROM person")).scalars().all()
        assert names == ["fiona b"]
        assert (
            sa.inspect(engine).get_table_names() == ["person"]
            or "person" in sa.inspect(engine).get_table_names()
        )
    engine.dispose()


def test_a_select_with_a_long_in_list_works_from_pyrqlite_and_sqlalchemy(node: Node) -> None:
    """rqlite QA: pyrqlite sends a SELECT as GET /db/query?q=… with its parameters written
    into the SQL; an IN list of 15,000 values (a URL over 64 KiB) was answered 400
    "Invalid HTTP request received." — rqlite takes URLs up to its 1 MiB head."""
    conn = dbapi2.connect(host="127.0.0.1", port=node.port)
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE many (id INTEGER PRIMARY KEY)")
        cur.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
            "INSERT INTO many(id) SELECT i FROM n"
        )
        wanted = list(range(5001, 20001))
        cur.execute(
            f"SELECT count(*) FROM many WHERE id IN ({','.join('?' * len(wanted))})", wanted
        )
        assert cur.fetchone()[0] == 15000
    finally:
        conn.close()
    engine = sa.create_engine(f"rqlite+pyrqlite://127.0.0.1:{node.port}/")
    many = sa.Table("many", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    with engine.connect() as c:
        found = c.execute(sa.select(sa.func.count()).where(many.c.id.in_(wanted))).scalar()
    assert found == 15000
