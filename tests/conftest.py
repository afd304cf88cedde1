"""Shared fixtures: real `tiny` runs, each played once per test session.

``tiny_run(agent, seed=0)`` runs ``run_experiment`` in this process (one torch thread, the
``tiny`` preset, MiniHack, 3 steps) the first time it is asked for and returns a
:class:`TinyRun`: the run directory plus what a few real functions of the loop were called with
(recorded by wrapping them: the wrapped functions still run and return what they return). The
end-to-end, ablation, golden and report tests share these runs, so each costs its ~15-25 s once.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as _hypothesis_settings

# Property tests draw the same examples on every run (derandomize): a property that fails does so
# on every machine and every run, never as a one-in-N flake that only CI sees.
_hypothesis_settings.register_profile("crl-bench", derandomize=True, database=None)
_hypothesis_settings.load_profile("crl-bench")

TINY_STEPS = 3


@dataclass
class TinyRun:
    path: Path
    agent: str
    seed: int
    calls: dict[str, list[Any]] = field(default_factory=dict)
    """Recorded calls, by name: "group_keys" (split flag, keys), "group_advantages" (scores),
    "count_aware_weights", "merge", "ask" (query, with_experience), "retrieval_config",
    "ask_samples" (kind, usage, malformed)."""


_RECORD = threading.local()
_LOCK = threading.Lock()
_ACTIVE: list[TinyRun] = []


def _record(name: str, value: Any) -> None:
    with _LOCK:
        if _ACTIVE:
            _ACTIVE[-1].calls.setdefault(name, []).append(value)


def _install_recorders(mp: pytest.MonkeyPatch) -> None:
    """Wrap (not replace) the functions whose calls the tests look at."""
    from crl_bench.algorithms import advantages, credit
    from crl_bench.experience import manager as manager_mod
    from crl_bench.extractor import merge as merge_mod
    from crl_bench.extractor import search_ask
    from crl_bench.extractor import track as extractor_track

    orig_keys = advantages.group_keys

    @functools.wraps(orig_keys)
    def group_keys(groups, with_exp, *args, **kwargs):
        keys = orig_keys(groups, with_exp, *args, **kwargs)
        split = kwargs.get("split", args[0] if args else None)
        _record("group_keys", {"split": split, "groups": groups.tolist(), "with_exp": with_exp.tolist(),
                               "keys": keys.tolist()})
        return keys

    orig_adv = advantages.group_advantages

    @functools.wraps(orig_adv)
    def group_advantages(scores, keys, *args, **kwargs):
        adv = orig_adv(scores, keys, *args, **kwargs)
        _record("group_advantages", {"scores": scores.tolist(), "adv": adv.tolist()})
        return adv

    orig_weights = credit.count_aware_weights

    @functools.wraps(orig_weights)
    def count_aware_weights(*args, **kwargs):
        out = orig_weights(*args, **kwargs)
        _record("count_aware_weights", out.tolist())
        return out

    mp.setattr(advantages, "group_keys", group_keys)
    mp.setattr(advantages, "group_advantages", group_advantages)
    mp.setattr(credit, "count_aware_weights", count_aware_weights)

    orig_merge = merge_mod.merge_bank

    def merge(manager, *args, **kwargs):
        _record("merge", kwargs.get("step"))
        return orig_merge(manager, *args, **kwargs)

    orig_init = manager_mod.ExperienceManager.__init__

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        _record("retrieval_config", self.retrieval)

    orig_ask = search_ask.SearchAndAsk.__call__

    def ask(self, query, episode_context):
        out = orig_ask(self, query, episode_context)
        ctx = episode_context if isinstance(episode_context, dict) else vars(episode_context)
        # a test of the tool alone may call it while a tiny run's recorder is installed in the
        # same worker: its task ids are not level seeds
        task_id = ctx.get("task_id")
        seed = int(task_id) if str(task_id).lstrip("-").isdigit() else -1
        _record("ask", {"query": query, "answer": out, "seed": seed})
        return out

    orig_add = extractor_track.ExtractorTrack.add_ask_samples

    def add_ask_samples(self, samples, score):
        out = orig_add(self, samples, score)  # credits each sample with the episode's score
        _record("ask_samples", [{"kind": s.kind, "usage": list(s.usage), "malformed": s.malformed,
                                 "created_step": s.created_step} for s in samples])
        return out

    mp.setattr(merge_mod, "merge_bank", merge)
    mp.setattr(manager_mod.ExperienceManager, "__init__", init)
    mp.setattr(search_ask.SearchAndAsk, "__call__", ask)
    mp.setattr(extractor_track.ExtractorTrack, "add_ask_samples", add_ask_samples)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """``tiny_run(agent, seed=0) -> TinyRun``: a real tiny run, played once per session."""
    pytest.importorskip("torch")
    pytest.importorskip("nle")
    from crl_bench.runner.api import run_experiment

    root = tmp_path_factory.mktemp("tiny_runs_shared")
    done: dict[tuple[str, int], TinyRun] = {}
    mp = pytest.MonkeyPatch()
    _install_recorders(mp)

    def get(agent: str, seed: int = 0) -> TinyRun:
        key = (agent, seed)
        if key not in done:
            path = root / f"minihack__{agent}__seed{seed}"
            run = TinyRun(path, agent, seed)
            with _LOCK:
                _ACTIVE.append(run)
            try:
                run_experiment(agent, "minihack", "tiny", seed, path, steps=TINY_STEPS, progress=False,
                               overrides={"threads": 1, "extractor.runs": "inline"})
            finally:
                with _LOCK:
                    _ACTIVE.remove(run)
            done[key] = run
        return done[key]

    yield get
    mp.undo()


# --- running the suite on several processes (pytest-xdist, ``-n 2 --dist loadgroup``) ---------
# The default command spreads tests over two worker processes. Tests that must share a process
# are given one xdist group here, so that nobody has to remember a marker:
# - every test that asks for ``tiny_run`` (the session's tiny runs are then made once, not once
#   per worker);
# - every test that starts a Ray cluster (one private cluster at a time on a 2-core machine:
#   two clusters' workers would fight for the same cores and their restart timeouts);
# - the torchrun tests (two gloo ranks each).
_RAY_FILES = ("test_ray_", "test_distributed_learner")
_TORCHRUN_FILES = ("test_fsdp",)


def xdist_group_of(nodeid: str, fixturenames: list[str]) -> str | None:
    """The xdist group a test belongs to (None: any worker)."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if name.startswith(_RAY_FILES):
        return "ray"
    if name.startswith(_TORCHRUN_FILES):
        return "torchrun"
    if "tiny_run" in fixturenames:
        return "tiny_runs"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = xdist_group_of(item.nodeid, list(getattr(item, "fixturenames", ())))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
