"""A child process writing to a bank (plain writes, then a merge) is killed with SIGKILL at a
random moment; the bank must reopen consistent (table and index agree), with every committed
change, and with the one transaction in flight either fully applied or not at all.

The child prints a line after each commit returns, so the parent knows what was committed; the
kill may fall between a commit and its line, so exactly one trailing change may be unlogged."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from crl_bench.experience.bank import ExperienceBank

DIM = 16
REPO = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from crl_bench.experience.bank import ExperienceBank

    path, seed = sys.argv[1], int(sys.argv[2])
    bank = ExperienceBank(path, dim=16, capacity=10**6)
    rng = np.random.default_rng(seed)
    if sys.argv[3] == "slow":
        # Widen the inside of each transaction (a pause per row written) so that most kills land
        # between BEGIN and COMMIT; without it most land in the index update after COMMIT.
        bank._conn.set_trace_callback(lambda sql: time.sleep(0.003) if sql.lstrip()[:6] in (
            "INSERT", "UPDATE", "DELETE") else None)

    def vecs(n):
        v = rng.standard_normal((n, 16)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    n = 0
    print("ready", flush=True)
    while True:
        n += 1
        tag = f"{seed}-{n}"
        live = bank.all_ids()
        roll = rng.random()
        if roll < 0.6 or len(live) < 5:
            size = int(rng.integers(1, 20))
            ids = bank.add([{"title": f"{tag}-{j}", "content": "x" * 500, "family": "f",
                             "task_ids": [tag]} for j in range(size)], vecs(size), step=n)
            print("A", tag, *ids, flush=True)
        elif roll < 0.85:
            i = int(rng.choice(live))
            bank.update(i, {"title": f"{tag}-u", "content": "updated"}, vecs(1)[0], step=n)
            print("U", tag, i, flush=True)
        else:
            ids = [int(i) for i in rng.choice(live, size=2, replace=False)]
            bank.delete(ids)
            print("D", tag, *ids, flush=True)
""")

MERGER = textwrap.dedent("""
    import json, re, sys, time
    from crl_bench.experience.bank import ExperienceBank
    from crl_bench.experience.embedder import load_embedder
    from crl_bench.experience.manager import ExperienceManager
    from _scripted_extractor import TextGeneration
    from crl_bench.extractor.merge import merge_bank

    embedder = load_embedder()
    bank = ExperienceBank(sys.argv[1], dim=embedder.dim, embedder_name=embedder.name)
    bank._conn.set_trace_callback(  # see WRITER: kills should often land inside a transaction
        lambda sql: time.sleep(0.005) if sql.lstrip()[:6] in ("INSERT", "DELETE") else None)
    plain_commit = bank.commit

    def logged_commit(**kw):  # report each committed transaction once it has returned
        res = plain_commit(**kw)
        print("C", " ".join(map(str, res.added_ids)), "|", " ".join(map(str, res.deleted_ids)),
              flush=True)
        return res

    bank.commit = logged_commit
    manager = ExperienceManager(bank, embedder)

    def generate(batch):
        out = []
        for messages in batch:
            ids = [int(i) for i in re.findall(r"\\[id (\\d+)\\]", messages[1]["content"])]
            out.append(TextGeneration("<answer>" + json.dumps([
                {"op": "merge", "ids": ids[:2], "title": f"merged {ids[:2]}",
                 "content": "keep both lessons"}]) + "</answer>"))
        return out

    print("ready", flush=True)
    step = 0
    while len(bank) > 2:
        step += 1
        merge_bank(manager, generate, step=step, chunk=3)
    print("done", flush=True)
""")


def run_and_kill(code: str, args: list[str], min_lines: int, extra_delay: float,
                 timeout: float = 120.0) -> list[str]:
    """Start the child, wait until it printed ``min_lines`` lines after "ready", wait
    ``extra_delay`` more seconds, SIGKILL it; returns the lines it printed."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    enough = threading.Event()

    def pump():
        for line in proc.stdout:
            if not line.endswith("\n"):
                break  # cut short by the kill: that change counts as unlogged
            lines.append(line.strip())
            if len(lines) > min_lines and lines[0] == "ready":
                enough.set()
        enough.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    assert enough.wait(timeout), "child produced no output in time"
    time.sleep(extra_delay)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t.join(timeout=10)
    assert alive, f"child ended before the kill:\n{proc.stderr.read()[-3000:]}"
    assert proc.returncode == -signal.SIGKILL
    return lines


def check_searchable(bank: ExperienceBank) -> None:
    ids = bank.all_ids()
    if ids:
        hits = bank.search(bank.get_embeddings(ids), k=1)
        assert all(h and h[0][1] > 0.999 for h in hits)


def test_sigkill_during_writes_keeps_every_commit(tmp_path):
    path = tmp_path / "bank.sqlite"
    titles: dict[int, str] = {}          # id -> title, as logged by the children
    rnd = random.Random(0)
    for round_ in range(6):
        pace = "slow" if round_ % 2 == 0 else "fast"
        lines = run_and_kill(WRITER, [str(path), str(round_), pace], min_lines=rnd.randint(5, 40),
                             extra_delay=rnd.uniform(0.0, 0.3))
        for line in lines[1:]:
            kind, tag, *ids = line.split()
            if kind == "A":
                for j, i in enumerate(ids):
                    titles[int(i)] = f"{tag}-{j}"
            elif kind == "U":
                titles[int(ids[0])] = f"{tag}-u"
            else:
                for i in ids:
                    titles.pop(int(i), None)
        with ExperienceBank(path, dim=DIM) as bank:
            assert bank.verify() == []
            present = {e.id: e for e in bank.get(bank.all_ids())}
            # The one change that may be committed but not logged: an add (a whole batch with
            # one new tag), an update (one title "<new tag>-u") or a delete of two ids.
            extra = set(present) - set(titles)
            missing = set(titles) - set(present)
            changed = {i for i in set(present) & set(titles) if present[i].title != titles[i]}
            assert len([s for s in (extra, missing, changed) if s]) <= 1, (extra, missing, changed)
            if extra:
                tags = {present[i].task_ids[0] for i in extra}
                assert len(tags) == 1
                (tag,) = tags
                assert sorted(present[i].title for i in extra) == sorted(
                    f"{tag}-{j}" for j in range(len(extra)))  # the whole batch, nothing less
                assert max(extra) > max(titles, default=0)
            assert len(missing) in (0, 2)
            assert len(changed) <= 1 and all(present[i].title.endswith("-u") for i in changed)
            check_searchable(bank)
            titles = {i: e.title for i, e in present.items()}  # next round starts from here


@pytest.mark.slow
def test_sigkill_during_merge_keeps_every_commit(tmp_path):
    path = tmp_path / "bank.sqlite"
    rng = np.random.default_rng(0)
    n = 60
    vecs = rng.standard_normal((n, 384)).astype(np.float32)
    with ExperienceBank(path, dim=384, embedder_name="all-MiniLM-L6-v2") as bank:
        bank.add([{"title": f"tip {i}", "content": f"advice {i}", "family": "minihack",
                   "source_trajectories": [f"s{i}"]} for i in range(n)], vecs, step=0)
    alive: set[int] = set(range(1, n + 1))
    rnd = random.Random(1)
    for round_ in range(2):
        lines = run_and_kill(MERGER, [str(path)], min_lines=rnd.randint(3, 12),
                             extra_delay=rnd.uniform(0.0, 0.2), timeout=300)
        committed = [ln for ln in lines if ln.startswith("C")]
        assert committed, lines
        for line in committed:
            added, deleted = line[1:].split("|")
            alive -= {int(i) for i in deleted.split()}
            alive |= {int(i) for i in added.split()}
        with ExperienceBank(path, dim=384) as bank:
            assert bank.verify() == []
            present = set(bank.all_ids())
            entries = bank.get(sorted(present))
            # every source trajectory is in exactly one entry: no window half-applied
            tags = sorted(t for e in entries for t in e.source_trajectories)
            assert tags == sorted(f"s{i}" for i in range(n))
            # no merged entry coexists with one of its parents
            for e in entries:
                assert not set(e.parent_ids) & present, e
            # every logged commit is there; at most one unlogged window beyond it
            if present != alive:
                extra, missing = present - alive, alive - present
                assert len(extra) == 1 and len(missing) == 2, (extra, missing)
                (new,) = extra
                assert set(bank.get([new])[0].parent_ids) == missing
                alive = present
            check_searchable(bank)
        assert len(alive) < n
