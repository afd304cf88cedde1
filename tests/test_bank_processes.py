"""Two real processes on one bank: one writer at a time (an OS lock on NAME.lock), a clear
refusal naming the holder, the lock gone with its holder (even after SIGKILL), capacity held
when two writer processes take turns, and a reader process that never returns entries the
writer deleted."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from crl_bench.experience.bank import (
    BankInUseError, ExperienceBank, lock_path, read_meta, restore_bank)

DIM = 16
REPO = Path(__file__).resolve().parents[1]
CEILING = 120.0  # seconds: generous, for a loaded 2-core machine; normal runs take ~1 s

# A child that takes the writer lock (retrying while another holds it, printing "refused
# <message>" on each refusal), then obeys commands from stdin, one per line:
#   add N            add N entries (family f), print "added <ids>"
#   delete ID...     delete, print "deleted"
#   update ID SEED   new title and embedding, print "updated"
#   close            close the bank, print "closed", exit
#   hang             sleep forever (to be killed)
CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from crl_bench.experience.bank import BankInUseError, ExperienceBank

    path, capacity, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rng = np.random.default_rng(abs(hash(tag)) % 2**32)

    def vecs(n, r=rng):
        v = r.standard_normal((n, 16)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    refused = 0
    while True:
        try:
            bank = ExperienceBank(path, dim=16, capacity=capacity)
            break
        except BankInUseError as exc:
            if refused == 0:
                print("refused", str(exc).replace("\\n", " "), flush=True)
            refused += 1
            time.sleep(0.02)
    print("holding", flush=True)
    step = 0
    for line in sys.stdin:
        cmd, *args = line.split()
        step += 1
        if cmd == "add":
            n = int(args[0])
            ids = bank.add([{"title": f"{tag}-{step}-{j}", "content": "c", "family": "f"}
                            for j in range(n)], vecs(n), step=step)
            print("added", *ids, flush=True)
        elif cmd == "delete":
            bank.delete([int(a) for a in args])
            print("deleted", flush=True)
        elif cmd == "update":
            v = vecs(1, np.random.default_rng(int(args[1])))[0]
            bank.update(int(args[0]), {"title": "moved", "content": "c"}, v, step=step)
            print("updated", flush=True)
        elif cmd == "close":
            bank.close()
            print("closed", flush=True)
            break
        elif cmd == "hang":
            time.sleep(3600)
""")


class Child:
    """A CHILD process with line-by-line conversation and a ceiling on every wait."""

    def __init__(self, path: Path, capacity: int = 10**6, tag: str = "a") -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(capacity), tag],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.strip())
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<eof>")
            self._cond.notify_all()

    def wait_for(self, prefix: str) -> str:
        """The first line starting with ``prefix`` (waiting up to CEILING)."""
        deadline = time.monotonic() + CEILING
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                if "<eof>" in self.lines:
                    raise AssertionError(f"child ended without {prefix!r}: {self.lines}\n"
                                         f"{self.proc.stderr.read()[-3000:]}")
                left = deadline - time.monotonic()
                assert left > 0, f"no {prefix!r} from the child in {CEILING} s: {self.lines}"
                self._cond.wait(left)

    def ask(self, command: str, reply: str) -> str:
        with self._cond:
            self.lines = [line for line in self.lines if not line.startswith(reply)]
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.wait_for(reply)

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def children():
    made: list[Child] = []
    yield made
    for child in made:
        child.finish()


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_second_writer_process_is_refused_naming_the_holder(tmp_path, children):
    path = tmp_path / "bank.sqlite"
    holder = Child(path)
    children.append(holder)
    holder.wait_for("holding")
    with pytest.raises(BankInUseError) as err:
        ExperienceBank(path, dim=DIM)
    msg = str(err.value)
    assert f"process {holder.proc.pid}" in msg and f"kill {holder.proc.pid}" in msg
    assert "read_only=True" in msg and "crl-bench bank" in msg and str(lock_path(path)) in msg
    # readers never take the writer lock: they open while it is held
    (new_id,) = holder.ask("add 1", "added").split()[1:]
    with ExperienceBank.open(path, read_only=True) as reader:
        assert reader.all_ids() == [int(new_id)]
    # a second writer *process* is refused just the same, and gets in once the holder closes
    other = Child(path, tag="b")
    children.append(other)
    refusal = other.wait_for("refused")
    assert f"process {holder.proc.pid}" in refusal
    assert not any(line == "holding" for line in other.lines)
    holder.ask("close", "closed")
    other.wait_for("holding")
    assert other.ask("add 2", "added").split()[1:] == [str(int(new_id) + 1),
                                                      str(int(new_id) + 2)]


def test_lock_dies_with_its_holder_even_on_sigkill(tmp_path, children):
    path = tmp_path / "bank.sqlite"
    holder = Child(path)
    children.append(holder)
    holder.wait_for("holding")
    holder.ask("add 3", "added")
    with pytest.raises(BankInUseError):
        ExperienceBank(path, dim=DIM)
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait(timeout=30)
    with ExperienceBank(path, dim=DIM) as bank:  # no stale lock to clean up
        assert len(bank) == 3 and bank.verify() == []


def test_same_process_second_writer_is_refused_and_close_releases(tmp_path):
    path = tmp_path / "bank.sqlite"
    first = ExperienceBank(path, dim=DIM)
    try:
        with pytest.raises(BankInUseError, match="this process .* another ExperienceBank"):
            ExperienceBank(path, dim=DIM)
        with ExperienceBank(path, dim=DIM, read_only=True) as reader:
            assert len(reader) == 0
    finally:
        first.close()
    ExperienceBank(path, dim=DIM).close()   # released by close()
    # a refused open (wrong dim) does not keep the lock either
    with pytest.raises(ValueError, match="16-dimensional"):
        ExperienceBank(path, dim=8)
    ExperienceBank(path, dim=DIM).close()


def test_restore_refuses_while_a_writer_holds_the_bank(tmp_path, children):
    path, copy = tmp_path / "bank.sqlite", tmp_path / "backup.sqlite"
    rng = np.random.default_rng(0)
    with ExperienceBank(path, dim=DIM) as bank:
        bank.add([{"title": "t", "content": "c", "family": "f"}], unit(rng, 1), step=0)
        bank.backup(copy)
    holder = Child(path)
    children.append(holder)
    holder.wait_for("holding")
    holder.ask("add 4", "added")
    with pytest.raises(BankInUseError):
        restore_bank(copy, path)                  # the running writer's file is not replaced
    with ExperienceBank.open(path, read_only=True) as reader:
        assert len(reader) == 5
    holder.ask("close", "closed")
    restore_bank(copy, path)                      # restore before opening: fine
    with ExperienceBank(path, dim=DIM) as bank:
        assert len(bank) == 1 and bank.verify() == []


def test_two_writer_processes_take_turns_and_capacity_holds(tmp_path, children):
    """The issue-20 scenario (two processes writing one bank of capacity 100 reached 160
    rows): now the second waits for the first, and the table never exceeds the capacity."""
    path, capacity = tmp_path / "bank.sqlite", 100
    ExperienceBank(path, dim=DIM, capacity=capacity).close()
    counts: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the table's size as any reader sees it, all along
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        while not stop.is_set():
            counts.append(conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
            time.sleep(0.002)
        conn.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        a = Child(path, capacity=capacity, tag="a")
        children.append(a)
        a.wait_for("holding")
        b = Child(path, capacity=capacity, tag="b")
        children.append(b)
        b.wait_for("refused")
        ids_a = [int(i) for _ in range(8) for i in a.ask("add 10", "added").split()[1:]]
        a.ask("close", "closed")
        b.wait_for("holding")
        ids_b = [int(i) for _ in range(8) for i in b.ask("add 10", "added").split()[1:]]
        b.ask("close", "closed")
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert max(counts) <= capacity and len(counts) > 10
    assert ids_b[0] > ids_a[-1]
    with ExperienceBank(path, dim=DIM, capacity=capacity) as bank:
        assert bank.all_ids() == (ids_a + ids_b)[-capacity:]   # FIFO across both writers
        assert bank.verify() == []


def test_reader_process_never_returns_entries_the_writer_deleted(tmp_path, children):
    """A reader (this process) keeps the bank open with its index built while the writer
    (another process) deletes, updates and adds: each search reflects the writer's commits."""
    path = tmp_path / "bank.sqlite"
    writer = Child(path, tag="w")
    children.append(writer)
    writer.wait_for("holding")
    ids = [int(i) for i in writer.ask("add 200", "added").split()[1:]]
    with ExperienceBank.open(path, read_only=True) as reader:
        assert reader.all_ids() == ids and reader.index_stats()["f"]["live"] == 200
        vecs = reader.get_embeddings(ids)
        assert [h[0][0] for h in reader.search(vecs, k=1)] == ids
        gone = ids[::2]
        writer.ask("delete " + " ".join(map(str, gone)), "deleted")
        hits = reader.search(vecs, k=5)
        returned = {i for row in hits for i, _ in row}
        assert not returned & set(gone), sorted(returned & set(gone))[:10]
        assert [h[0][0] for h in hits[1::2]] == ids[1::2]
        assert len(reader) == 100 and reader.all_ids() == ids[1::2]
        writer.ask(f"update {ids[1]} 77", "updated")
        moved = reader.get_embeddings([ids[1]])
        assert reader.search(moved, k=1)[0][0][0] == ids[1]
        assert reader.get([ids[1]])[0].title == "moved"
        (late,) = [int(i) for i in writer.ask("add 1", "added").split()[1:]]
        assert reader.search(reader.get_embeddings([late]), k=1)[0][0][0] == late
        assert reader.verify() == []
    writer.ask("close", "closed")
    assert read_meta(path)["dim"] == str(DIM)


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_writer_through_another_name_of_the_same_file_is_refused(tmp_path, children, link):
    """The writer lock was keyed by the path string: a second writer through a hard link got a
    WAL of its own (2,000 of 4,000 committed entries were lost), through a symbolic link its
    index disagreed with the table. It is keyed by the file's device and inode too now."""
    path = tmp_path / "bank.sqlite"
    holder = Child(path)
    children.append(holder)
    holder.wait_for("holding")
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    alias = other_dir / "alias.sqlite"
    if link == "hard":
        os.link(path, alias)
    else:
        alias.symlink_to(path)
    assert os.stat(alias).st_ino == os.stat(path).st_ino
    with pytest.raises(BankInUseError) as err:
        ExperienceBank(alias, dim=DIM)
    msg = str(err.value)
    assert f"process {holder.proc.pid}" in msg and f"kill {holder.proc.pid}" in msg
    assert f"under another name, {path}" in msg
    # a second writer *process* through the other name waits its turn, and loses nothing
    other = Child(alias, tag="b")
    children.append(other)
    assert f"process {holder.proc.pid}" in other.wait_for("refused")
    first = holder.ask("add 3", "added").split()[1:]
    holder.ask("close", "closed")
    other.wait_for("holding")
    second = other.ask("add 2", "added").split()[1:]
    other.ask("close", "closed")
    with ExperienceBank.open(path, read_only=True) as reader:
        assert reader.all_ids() == sorted(int(i) for i in first + second)
        assert len(reader) == 5 and reader.verify() == []
