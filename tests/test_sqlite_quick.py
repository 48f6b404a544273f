"""recordstore.sqlite_quick: reads and writes on the calling thread that never wait."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from recordstore.sqlite_quick import CHECKPOINT_EVERY, Quick


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


def test_a_busy_file_does_not_hold_a_read_and_a_read_writes_nothing(db):
    path, other = db
    reader = Quick(path)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES ('a', '1')")
    assert reader.read("SELECT count(*) FROM t", ()) == [(0,)]  # WAL: readers never wait
    other.execute("COMMIT")
    assert reader.read("INSERT INTO t VALUES ('b', '2')", ()) is None  # a read never writes
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


# -- writes ---------------------------------------------------------------------------------


def test_a_write_runs_on_the_calling_thread_and_its_answer_is_the_rows_changed(db):
    path, other = db
    writer = Quick(path)
    assert writer.write("INSERT INTO t VALUES (?, ?)", ("a", "1")) == 1
    assert writer.write("INSERT INTO t VALUES (?, ?)", [("b", "2"), ("c", "3")], many=True) == 2
    assert other.execute("SELECT count(*) FROM t").fetchone() == (3,)
    with pytest.raises(sqlite3.IntegrityError):  # the statement's own answer, as it is
        writer.write("INSERT INTO t VALUES (?, ?)", ("a", "again"))
    writer.close()
    assert writer.write("INSERT INTO t VALUES ('d', '4')", ()) is None


def test_a_write_that_would_wait_for_the_lock_is_not_run(db):
    path, other = db
    writer = Quick(path)
    other.execute("BEGIN IMMEDIATE")
    started = time.perf_counter()
    assert writer.write("INSERT INTO t VALUES ('a', '1')", ()) is None
    assert time.perf_counter() - started < 0.5  # answered at once, not after a timeout
    other.execute("COMMIT")
    assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append(writer.write("DELETE FROM t", ())))
    thread.start()
    thread.join()
    assert writer.write("INSERT INTO t VALUES ('a', '1')", ()) == 1
    assert answers == [None]  # the connection belongs to the thread that first used it
    writer.close()


def test_a_write_of_many_rows_writes_all_of_them_or_none(db):
    path, other = db
    writer = Quick(path)
    other.execute("INSERT INTO t VALUES ('b', 'taken')")
    with pytest.raises(sqlite3.IntegrityError):  # the second row conflicts
        writer.write("INSERT INTO t VALUES (?, ?)", [("a", "1"), ("b", "2")], many=True)
    # The first row is not left behind for the caller's retry to write again.
    assert other.execute("SELECT k FROM t ORDER BY k").fetchall() == [("b",)]
    other.execute("BEGIN IMMEDIATE")
    assert writer.write("INSERT INTO t VALUES (?, ?)", [("c", "3")], many=True) is None
    other.execute("COMMIT")
    assert writer.write("INSERT INTO t VALUES (?, ?)", [("c", "3"), ("d", "4")], many=True) == 2
    assert other.execute("SELECT count(*) FROM t").fetchone() == (3,)
    writer.close()


def test_statements_written_together_are_one_transaction(db):
    path, other = db
    writer = Quick(path)
    other.execute("INSERT INTO t VALUES ('gone', 'x'), ('b', 'taken')")
    together = [
        ("DELETE FROM t WHERE k = ?", ("gone",), False),
        ("INSERT INTO t VALUES (?, ?)", [("a", "1"), ("b", "2")], True),  # 'b' conflicts
    ]
    with pytest.raises(sqlite3.IntegrityError):
        writer.write_all(together)
    # Nothing of it is kept: the delete before the conflict was rolled back too.
    assert other.execute("SELECT k FROM t ORDER BY k").fetchall() == [("b",), ("gone",)]
    other.execute("BEGIN IMMEDIATE")  # busy: not run here, for the worker thread to run
    assert writer.write_all([("DELETE FROM t WHERE k = ?", ("gone",), False)]) is None
    other.execute("COMMIT")
    assert other.execute("SELECT count(*) FROM t").fetchone() == (2,)
    changed = writer.write_all([
        ("DELETE FROM t WHERE k = ?", ("gone",), False),
        ("INSERT INTO t VALUES (?, ?)", [("c", "3"), ("d", "4")], True),
    ])
    assert changed == [1, 2]
    assert other.execute("SELECT k FROM t ORDER BY k").fetchall() == [("b",), ("c",), ("d",)]
    writer.close()


def test_writes_stop_once_the_loop_has_spent_its_share(db):
    path, other = db
    writer = Quick(path, share=0.0, burst=0.0005)
    answers = [writer.write("INSERT INTO t VALUES (?, '1')", (str(i),)) for i in range(200)]
    # The burst is spent by the first writes; with no refill, none runs after that.
    assert answers[0] == 1
    assert answers[-1] is None
    ran = sum(1 for a in answers if a == 1)
    assert other.execute("SELECT count(*) FROM t").fetchone() == (ran,)
    assert ran < 200
    writer.close()


def test_every_so_many_writes_one_is_left_to_the_worker_thread(db):
    path, _ = db
    writer = Quick(path, share=1.0, burst=10.0)
    answers = [writer.write("INSERT INTO t VALUES (?, '1')", (str(i),)) for i in range(3 * CHECKPOINT_EVERY)]
    # Its commit checkpoints the WAL; this connection never does (wal_autocheckpoint = 0).
    assert [i + 1 for i, a in enumerate(answers) if a is None] == [
        CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY, 3 * CHECKPOINT_EVERY
    ]
    writer.close()


def _read_calls() -> int:
    with open("/proc/self/io") as io:  # read system calls of this process, pread included
        return int(next(line for line in io if line.startswith("syscr:")).split()[1])


def test_reads_and_writes_share_the_connection_and_its_own_writes_keep_its_cache(db):
    # A read after this connection's own write finds its pages in its cache; after
    # another connection's commit SQLite empties that cache and reads them again.
    path, other = db
    other.executemany("INSERT INTO t VALUES (?, ?)", [(f"k{n:04d}", "x" * 300) for n in range(2000)])
    quick = Quick(path, share=1.0, burst=1.0)
    assert quick.read("SELECT count(*) FROM t", ()) == [(2000,)]  # pages now in its cache
    assert quick.write("INSERT INTO t VALUES ('own', '1')", ()) == 1
    before = _read_calls()
    itself = _read_calls() - before  # reading /proc/self/io counts too
    before = _read_calls()
    assert quick.read("SELECT v FROM t WHERE k = ?", ("k1500",)) == [("x" * 300,)]
    after_own = _read_calls() - before - itself
    other.execute("INSERT INTO t VALUES ('theirs', '2')")
    before = _read_calls()
    assert quick.read("SELECT v FROM t WHERE k = ?", ("k1500",)) == [("x" * 300,)]
    after_theirs = _read_calls() - before - itself
    # The B-tree's path to the row (root, interior, leaf) read again only in the second.
    assert after_own + 2 <= after_theirs
    assert quick.read("SELECT v FROM t WHERE k = ?", ("theirs",)) == [("2",)]
    quick.close()


def test_a_read_never_sees_a_write_left_open(db):
    path, _ = db
    quick = Quick(path, share=1.0, burst=1.0)
    conn = quick._connection()
    assert conn is not None
    conn.execute("BEGIN IMMEDIATE")  # as a write whose rollback failed would leave it
    conn.execute("INSERT INTO t VALUES ('uncommitted', '1')")
    assert quick.read("SELECT count(*) FROM t", ()) is None  # the worker thread reads instead
    conn.execute("ROLLBACK")
    assert quick.read("SELECT count(*) FROM t", ()) == [(0,)]
    quick.close()
