"""recordstore.sqlite_quick: statements on the calling thread that never wait."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from recordstore.sqlite_quick import Quick


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "q.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
    yield path, conn
    conn.close()


def test_writes_and_reads_are_seen_by_other_connections(db):
    path, other = db
    writer, reader = Quick(path, read_only=False), Quick(path, read_only=True)
    assert writer.write([("INSERT INTO t VALUES (?, ?)", ("a", "1"))]) == 1
    assert writer.write([("INSERT INTO t VALUES (?, ?)", [("b", "2"), ("c", "3")])], many=True) == 2
    assert other.execute("SELECT k FROM t ORDER BY k").fetchall() == [("a",), ("b",), ("c",)]
    other.execute("INSERT INTO t VALUES ('d', '4')")
    assert reader.read("SELECT v FROM t WHERE k = ?", ("d",)) == [("4",)]
    writer.close()
    reader.close()


def test_a_taken_key_is_the_statements_answer_and_rolls_back_the_transaction(db):
    path, other = db
    writer = Quick(path, read_only=False)
    writer.write([("INSERT INTO t VALUES (?, ?)", ("a", "1"))])
    with pytest.raises(sqlite3.IntegrityError):
        writer.write([
            ("INSERT INTO t VALUES (?, ?)", ("z", "9")),
            ("INSERT INTO t VALUES (?, ?)", ("a", "2")),
        ])
    assert other.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [("a", "1")]
    writer.close()


def test_a_busy_file_another_thread_or_a_read_only_write_answer_none(db):
    path, other = db
    writer, reader = Quick(path, read_only=False), Quick(path, read_only=True)
    other.execute("BEGIN IMMEDIATE")
    assert writer.write([("INSERT INTO t VALUES (?, ?)", ("a", "1"))]) is None
    assert reader.read("SELECT count(*) FROM t", ()) == [(0,)]  # WAL: readers never wait
    other.execute("COMMIT")
    assert reader.write([("INSERT INTO t VALUES (?, ?)", ("a", "1"))]) is None  # query_only
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append(reader.read("SELECT 1", ())))
    thread.start()
    thread.join()
    assert answers == [None]
    assert other.execute("SELECT count(*) FROM t").fetchall() == [(0,)]
    writer.close()
    reader.close()
