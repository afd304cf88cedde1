"""Resume is exact (issue 20): a run SIGKILLed at any of five moments and continued with
``--resume`` leaves the same records *and bank* as the uninterrupted run with the same seed.

Each case runs ``crl-bench run`` (comp_rl, MiniHack, the ``tiny`` preset, 3 steps, one torch
thread, the extractor track inline) in a subprocess with a fault-injection hook installed
(tests/_faults.py, ``<moment>[@<step>]``): the process SIGKILLs itself when it gets there.
Then ``crl-bench run --resume`` finishes it,
and its ``episodes.jsonl``, ``metrics.jsonl`` and ``extractor.jsonl`` (without wall-clock
timing, memory and time fields), ``eval.jsonl`` and bank entries (titles, contents, families,
usage and outcome counts) must equal those of one uninterrupted reference run, shared by the five cases.

The moments: at startup (bank created, nothing recorded); during the rollout of step 2 (the
step's retrievals already counted in the bank, checkpoint 1 behind); after step 3's episodes
were written (checkpoint 2 behind); inside the write of checkpoint 2 (a half-written temporary
folder left); after step 1's episodes with the bank already filled by the extractor but before
the first checkpoint (the restart must begin from the run's empty start bank).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

from crl_bench.records.files import RunDir, read_jsonl  # noqa: E402

BIN = Path(sys.executable).parent
FAULTS = Path(__file__).with_name("_faults.py")
STEPS = 3
RUN_ARGS = ["--agent", "comp_rl", "--tasks", "minihack", "--preset", "tiny", "--seed", "0",
            "--steps", str(STEPS), "--no-progress", "--no-report",
            "--set", "threads=1", "--set", "extractor.runs=inline"]
# wall-clock figures: they differ between any two runs, interrupted or not
VOLATILE_PREFIXES = ("timing_s/", "memory/")
VOLATILE_KEYS = {"time", "wall_s", "bank/batch_latency_p50_s", "bank/batch_latency_p99_s",
                 "extractor/extract_s", "extractor/merge_s"}


def crl(*args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``crl-bench ARGS``; with ``kill_at`` under the fault injector of tests/_faults.py."""
    env = dict(os.environ, TQDM_DISABLE="1", OMP_NUM_THREADS="1", CRL_WANDB="0")
    cmd = ([sys.executable, str(FAULTS), kill_at] if kill_at else [str(BIN / "crl-bench")])
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=900, env=env)


def stable(record: dict) -> dict:
    return {k: v for k, v in record.items()
            if k not in VOLATILE_KEYS and not k.startswith(VOLATILE_PREFIXES)
            and not re.search(r"(^|[/_])time_\w*_s$", k)}  # losses/actor_time_forward_s, ...


def bank_entries(path: Path) -> list[dict]:
    from crl_bench.experience.bank import ExperienceBank

    if not path.exists():
        return []
    with ExperienceBank.open(path, read_only=True) as bank:
        entries = bank.get(bank.all_ids())
    return [{"id": e.id, "title": e.title, "content": e.content, "family": e.family,
             "task_ids": e.task_ids, "times_retrieved": e.times_retrieved,
             "times_trained": e.times_trained, "n_used": e.n_used, "reward_sum": e.reward_sum,
             "created_step": e.created_step, "updated_step": e.updated_step, "version": e.version,
             "origin": e.origin, "parent_ids": e.parent_ids, "last_trained_step": e.last_trained_step,
             "retrieved_steps_ago": _steps_ago(e, bank.meta)}
            for e in sorted(entries, key=lambda e: e.id)]


def _steps_ago(entry, meta: dict) -> float | None:
    """last_retrieved on the run's logical clock (bank creation + step x step_s), as a step."""
    if entry.last_retrieved is None:
        return None
    return round((entry.last_retrieved - float(meta["created_at"])) / 300.0, 6)


def snapshot(run: Path) -> dict:
    return {"episodes": [stable(r) for r in read_jsonl(run / "episodes.jsonl")],
            "metrics": [stable(r) for r in read_jsonl(run / "metrics.jsonl")],
            "eval": read_jsonl(run / "eval.jsonl"),
            "extractor": [stable(r) for r in read_jsonl(run / "extractor.jsonl")],
            "bank": bank_entries(run / "bank.sqlite"),
            "status": json.loads((run / "status.json").read_text())["state"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("resume_exact") / "uninterrupted"
    res = crl("run", *RUN_ARGS, "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    snap = snapshot(out)
    assert snap["status"] == "done"
    assert snap["bank"], "the reference run wrote no bank entries: the bank comparison is empty"
    assert snap["extractor"], "no extractor batch record: the extractor.jsonl comparison is empty"
    assert any(e["experience_ids"] for e in snap["episodes"]), "no episode used an entry"
    return snap


def checkpoint_step(run: Path) -> int | None:
    last = RunDir(run).last_checkpoint()
    return None if last is None else json.loads((last / "loop_state.json").read_text())["step"]


# (kill spec, checkpoint step expected at the kill, what the kill must have left behind)
CASES = {
    "startup": ("startup", None),
    "rollout": ("rollout@2", 1),
    "episodes": ("episodes@3", 2),
    "checkpoint_write": ("checkpoint@2", 1),
    "before_first_checkpoint_bank_filled": ("episodes@1", None),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_then_resume_equals_uninterrupted_run(reference, tmp_path, case):
    spec, ckpt = CASES[case]
    out = tmp_path / case
    res = crl("run", *RUN_ARGS, "--out", str(out), kill_at=spec)
    assert res.returncode == -signal.SIGKILL, (res.returncode, res.stderr[-3000:])
    assert json.loads((out / "status.json").read_text())["state"] == "running"
    assert checkpoint_step(out) == ckpt
    if case == "checkpoint_write":
        assert list((out / "checkpoints").glob(".tmp-*")), "no half-written checkpoint left"
    if case == "before_first_checkpoint_bank_filled":
        assert bank_entries(out / "bank.sqlite"), "the bank was empty at the kill"
    if case == "episodes":
        assert any(e["step"] == 3 for e in read_jsonl(out / "episodes.jsonl"))
    res = crl("run", "--out", str(out), "--resume", "--no-progress", "--no-report")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not list((out / "checkpoints").glob(".tmp-*"))
    got = snapshot(out)
    for part in ("episodes", "eval", "metrics", "extractor", "bank", "status"):
        assert got[part] == reference[part], _first_difference(part, got[part], reference[part])


def _first_difference(part: str, got, want) -> str:
    if isinstance(got, list) and isinstance(want, list):
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                if isinstance(g, dict) and isinstance(w, dict):
                    keys = sorted(set(g) | set(w), key=str)
                    diff = {k: (g.get(k), w.get(k)) for k in keys if g.get(k) != w.get(k)}
                    return f"{part}[{i}] differs (resumed, uninterrupted): {diff}"
                return f"{part}[{i}]: {g!r} != {w!r}"
        return f"{part}: {len(got)} records resumed, {len(want)} uninterrupted"
    return f"{part}: {got!r} != {want!r}"


# ------------------------------------------------------------------ the parts, without a run
def test_step_clock_makes_recency_a_matter_of_steps():
    from crl_bench.experience.manager import RetrievalConfig, diversified_order, step_clock

    step = [5]
    clock = step_clock(lambda: step[0], 300.0, origin=1_700_000_000.0)
    assert clock() == 1_700_000_000.0 + 5 * 300.0
    cfg = RetrievalConfig(recent_s=300.0, step_s=300.0, drop_recent_top1_p=0.0)
    cands = [(1, 0.9), (2, 0.8)]
    times = {1: 1, 2: 0}  # score = -rank - 0.4 ln(1 + times) - 1[recent]
    last = {1: clock()}  # entry 1 retrieved earlier in this step: recent, it gives way
    import random

    assert diversified_order(cands, times, last, clock(), cfg, random.Random(0)) == [2, 1]
    step[0] = 6  # one step later (300 logical seconds): no longer recent
    assert diversified_order(cands, times, last, clock(), cfg, random.Random(0)) == [1, 2]
    with pytest.raises(ValueError):
        step_clock(lambda: 0, 0.0)
    with pytest.raises(ValueError):
        RetrievalConfig(step_s=float("nan"))


def test_manager_state_and_bank_backup_resume_retrieval_exactly(tmp_path):
    """Retrievals after a restore (bank backup + manager state, as a checkpoint holds them) give
    the same entries and counters as the manager that went on without stopping."""
    import torch

    from crl_bench.experience.bank import ExperienceBank, restore_bank
    from crl_bench.experience.embedder import load_embedder
    from crl_bench.experience.manager import (ExperienceManager, Operation, RetrievalConfig,
                                              step_clock)

    torch.set_num_threads(1)
    emb = load_embedder()
    facts = [(f"Tip {i}", f"In room {i} walk {'north' if i % 2 else 'east'} to the stairs {i}.")
             for i in range(12)]
    queries = [f"reach the stairs in room {i % 5}" for i in range(40)]
    cfg = dict(k=2, oversample=4, recent_s=300.0, step_s=300.0, drop_recent_top1_p=0.5, seed=3)
    step = [0]

    def manager(path):
        bank = ExperienceBank(path, dim=emb.dim, embedder_name=emb.name)
        return ExperienceManager(bank, emb, RetrievalConfig(**cfg),
                                 clock=step_clock(lambda: step[0], 300.0))

    def play(m, qs):
        out = []
        for i, q in enumerate(qs):
            step[0] = i // 4  # four retrievals per "step"
            out.append([e.id for e in m.retrieve([q])[0]])
        return out

    a = manager(tmp_path / "a.sqlite")
    a.apply_operations([Operation("add", t, c) for t, c in facts], family="f", task_id="t",
                       provenance={}, step=1)
    play(a, queries[:20])
    state = json.loads(json.dumps(a.state()))  # through JSON, as the checkpoint stores it
    vecs = a.query_cache_vectors(state["query_cache"])
    a.bank.backup(tmp_path / "ckpt.sqlite")
    want = play(a, queries[20:])
    want_stats = {k: v for k, v in a.stats().items() if "latency" not in k}
    a.bank.close()

    restore_bank(tmp_path / "ckpt.sqlite", tmp_path / "b.sqlite")
    b = manager(tmp_path / "b.sqlite")
    b.load_state(state, vecs)
    got = play(b, queries[20:])
    got_stats = {k: v for k, v in b.stats().items() if "latency" not in k}
    b.bank.close()
    assert got == want
    assert got_stats == want_stats
    assert want_stats["bank/queries"] == 40 and want_stats["bank/ops_add"] == 12



def test_a_clean_restart_gets_the_bank_the_run_started_with(tmp_path):
    """Before the first checkpoint the restart begins from the bank as the run found it: the
    copy taken at start (a bank brought along), or no bank at all."""
    import numpy as np

    from crl_bench.experience.bank import ExperienceBank
    from crl_bench.runner.api import _keep_start_bank, _restore_start_bank

    def add(path, title):
        with ExperienceBank(path, dim=4) as bank:
            bank.add([{"title": title, "content": "c", "family": "f"}],
                     np.ones((1, 4), dtype=np.float32) / 2, step=1)

    def titles(path):
        if not path.exists():
            return None
        with ExperienceBank.open(path, read_only=True) as bank:
            return sorted(e.title for e in bank.get(bank.all_ids()))

    brought = RunDir(tmp_path / "brought")
    add(brought.bank_path, "at start")
    _keep_start_bank(brought)
    add(brought.bank_path, "by the dead attempt")
    _keep_start_bank(brought)  # a second start (the first died before the bank): kept as it was
    assert titles(brought.bank_path) == ["at start", "by the dead attempt"]
    _restore_start_bank(brought)
    assert titles(brought.bank_path) == ["at start"]

    fresh = RunDir(tmp_path / "fresh")
    _keep_start_bank(fresh)
    add(fresh.bank_path, "by the dead attempt")
    _restore_start_bank(fresh)
    assert titles(fresh.bank_path) is None
    assert not list(fresh.path.glob("bank.sqlite-*"))
