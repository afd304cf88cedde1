"""Env workers on a real local Ray cluster: remote envs play exactly like local ones, a worker
killed by pid mid-step has its episodes replayed elsewhere (nothing lost or duplicated), and the
rollout engine with batched remote steps gives the same trajectories as with local envs."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")

from crl_bench.distributed.env_workers import RemoteEnvPool, RemoteEnv  # noqa: E402

ENV_ID = "crl/MiniHack-Room-5x5-v0"
MOVES = ["north", "east", "south", "west", "northeast", "southwest"]


@pytest.fixture(scope="module")
def cluster():
    with local_ray(4):
        yield


def local_play(seed: int, actions: list[str]) -> list[tuple]:
    import gymnasium

    import crl_bench  # noqa: F401

    env = gymnasium.make(ENV_ID)
    out = [env.reset(seed=seed)]
    out += [env.step(a) for a in actions]
    env.close()
    return out


def strip(res: tuple) -> tuple:
    """Everything of a reset/step result (info included; arrays, such as MiniHack's
    ``info["raw_obs"]``, compared by dtype, shape and bytes)."""
    import numpy as np

    def plain(v):
        if isinstance(v, np.ndarray):
            return ("array", str(v.dtype), v.shape, v.tobytes())
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return tuple(plain(r) for r in res)


def test_worker_killed_mid_step_replays_its_episodes(cluster):
    pool = RemoteEnvPool(2, worker_options={"num_cpus": 1}, step_delay_s=0.15)
    try:
        envs = pool.make_many(ENV_ID, 4)
        assert sorted(pool.slots[e.slot].worker for e in envs) == [0, 0, 1, 1]
        seeds = [11, 12, 13, 14]
        rng = random.Random(0)
        plans = [[rng.choice(MOVES) for _ in range(6)] for _ in envs]
        got = {e.slot: [r] for e, r in zip(envs, pool.reset_many(
            [(e.slot, s, None) for e, s in zip(envs, seeds)]))}
        pid0 = pool.pids()[0]
        killed = threading.Event()
        kill_was_inflight = []

        def killer():
            # wait for the third batch's call to be in flight on worker 0, then SIGKILL it
            while not (pool_steps[0] >= 2 and 0 in pool.inflight):
                time.sleep(0.005)
            time.sleep(0.1)  # inside its first step's 0.15 s: mid-step
            kill_was_inflight.append(0 in pool.inflight)
            os.kill(pid0, signal.SIGKILL)
            killed.set()

        pool_steps = [0]
        t = threading.Thread(target=killer, daemon=True)
        t.start()
        for k in range(6):
            res = pool.step_many([(e.slot, plans[i][k]) for i, e in enumerate(envs)])
            for e, r in zip(envs, res):
                got[e.slot].append(r)
            pool_steps[0] += 1
        t.join(timeout=30)
        assert killed.is_set() and kill_was_inflight == [True]
        assert pool.worker_failures == 1 and pool.replays == 2
        assert pool.alive == [False, True]
        assert all(pool.slots[e.slot].worker == 1 for e in envs)  # moved to the live worker
        for i, e in enumerate(envs):
            ref = local_play(seeds[i], plans[i])
            assert len(got[e.slot]) == 7  # reset + 6 steps: none lost, none twice
            assert [strip(r) for r in got[e.slot]] == [strip(r) for r in ref]
            assert pool.slots[e.slot].actions == plans[i]
        # Ray restarts the killed worker (max_restarts=1); it rejoins the pool
        deadline = time.time() + 60
        while pool.revive(timeout_s=2) == [] and time.time() < deadline:
            time.sleep(0.5)
        assert pool.alive == [True, True]
        assert pool.pids()[0] != pid0
    finally:
        pool.close()


class ScriptedBackend:
    """A deterministic stand-in for the LLM (the rollout's env side is what is tested here):
    the tokenizer of the tiny model, completions chosen from the prompt's hash."""

    def __init__(self):
        from crl_bench.llm.models import load_tokenizer

        self.tokenizer = load_tokenizer("tiny-random")
        self.calls = 0

    def chat_prompt_ids(self, messages):
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True)
        return [int(t) for t in (out["input_ids"] if hasattr(out, "keys") else out)]

    def generate(self, prompts, sampling, adapter=None, max_new_tokens=None):
        from crl_bench.llm.types import Generation

        self.calls += 1
        out = []
        for p in prompts:
            h = sum(p[-50:]) + len(p)
            text = (f"<answer>{MOVES[h % len(MOVES)]}</answer>" if h % 5 else "no tags")
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(prompt_ids=list(p), completion_ids=ids, text=text,
                                  logprobs=[-1.0] * len(ids), finish_reason="stop"))
        return out


def test_batched_remote_rollout_equals_local(cluster):
    import gymnasium

    from crl_bench.distributed.env_workers import batched_step_engine_class
    from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine
    from crl_bench.llm.types import SamplingParams

    backend = ScriptedBackend()
    prompt = PromptConfig(max_turns=6)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    seeds = [21, 21, 22, 23]

    def specs(envs):
        return [EpisodeSpec(env=e, seed=s, group_id=i // 2, task_name="room") for i, (e, s)
                in enumerate(zip(envs, seeds))]

    local_envs = [gymnasium.make(ENV_ID) for _ in seeds]
    ref = RolloutEngine(backend, sampling, prompt).run(specs(local_envs))
    pool = RemoteEnvPool(2, worker_options={"num_cpus": 1})
    try:
        remote = pool.make_many(ENV_ID, len(seeds))
        assert all(isinstance(e, RemoteEnv) for e in remote)
        engine = batched_step_engine_class()(backend, sampling, prompt)
        got = engine.run(specs(remote))
        assert engine.prefetched_steps == sum(t.n_actions for t in got) > 0
        for a, b in zip(ref, got):
            da, db = a.to_json(), b.to_json()
            for d in (da, db):
                d.pop("wall_s")
            assert da == db
        # every prefetched step was taken by the engine: none left behind
        assert not pool._prefetched
        assert [len(pool.slots[e.slot].actions) for e in remote] == [t.n_actions for t in got]
    finally:
        pool.close()
        for e in local_envs:
            e.close()
