"""recordstore.sqlite_quick: reads on the calling thread that never wait."""

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


def test_reads_see_other_connections_writes(db):
    path, other = db
    reader = Quick(path)
    other.execute("INSERT INTO t VALUES ('d', '4')")
    assert reader.read("SELECT v FROM t WHERE k = ?", ("d",)) == [("4",)]
    reader.close()


def test_a_busy_file_does_not_hold_a_read_and_the_connection_writes_nothing(db):
    path, other = db
    reader = Quick(path)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES ('a', '1')")
    assert reader.read("SELECT count(*) FROM t", ()) == [(0,)]  # WAL: readers never wait
    other.execute("COMMIT")
    assert reader.read("INSERT INTO t VALUES ('b', '2')", ()) is None  # query_only
    assert other.execute("SELECT k FROM t").fetchall() == [("a",)]
    reader.close()


def test_another_thread_or_a_closed_reader_answers_none(db):
    path, _ = db
    reader = Quick(path)
    assert reader.read("SELECT 1", ()) == [(1,)]
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append(reader.read("SELECT 1", ())))
    thread.start()
    thread.join()
    assert answers == [None]
    reader.close()
    assert reader.read("SELECT 1", ()) is None
