"""A 2-node Ray cluster simulated with ray.cluster_utils.Cluster: env workers spread over both
nodes, and a `tiny` comp_rl run through `run_experiment(..., ray=...)` on it (envs, generation,
learner ranks and the experience service as actors) whose records are complete (every step's
episodes, trajectories, metrics, the bank) and consistent with each other."""

from __future__ import annotations

import gzip
import json

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("transformers")

STEPS = 2


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False,
        "env_vars": {"OMP_NUM_THREADS": "1"}})
    cluster.add_node(num_cpus=2, env_vars={"OMP_NUM_THREADS": "1"})
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_env_workers_spread_over_both_nodes(two_nodes):
    from crl_bench.distributed.env_workers import RemoteEnvPool

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    pool = RemoteEnvPool(2, worker_options={"num_cpus": 1}, spread=True)
    try:
        assert len(set(pool.nodes())) == 2
        env = pool.make("crl/MiniHack-Room-5x5-v0")
        obs, info = env.reset(seed=3)
        assert isinstance(obs, str) and info["admissible_actions"]
    finally:
        pool.close()


def test_tiny_run_on_two_nodes(two_nodes, tmp_path, monkeypatch):
    import torch

    from crl_bench.distributed import extractor as ext_mod
    from crl_bench.runner.api import run_experiment

    started = []
    orig = ext_mod.RayHost.start.__func__

    def start(cls, *args, **kwargs):  # wrapped, not replaced: the real actor starts
        host = orig(cls, *args, **kwargs)
        started.append(host.describe()["pid"])
        return host

    monkeypatch.setattr(ext_mod.RayHost, "start", classmethod(start))

    torch.set_num_threads(1)
    # comp_rl: the bank in the experience service, the extractor track writing to it
    out = run_experiment("comp_rl", "minihack", "tiny", 0, tmp_path / "run", steps=STEPS,
                         overrides={"threads": 1, "extractor.runs": "process"}, progress=False,
                         ray={"address": two_nodes.address, "plan": "cpu"})
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "done" and status["step"] == STEPS
    cfg = json.loads((out / "config.json").read_text())
    per_step = cfg["rollout"]["groups"] * cfg["rollout"]["group_size"]
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    train = [e for e in episodes if e["phase"] == "train"]
    for step in range(1, STEPS + 1):
        mine = [e for e in train if e["step"] == step]
        assert len(mine) == per_step  # none lost, none twice
        trajs = [json.loads(x) for x in gzip.open(
            out / "trajectories" / f"train_step_{step:05d}.jsonl.gz", "rt").read().splitlines()]
        assert len(trajs) == per_step
        for e, t in zip(mine, trajs):  # the records agree with the trajectories
            assert (e["seed"], e["score"], e["n_actions"], e["n_turns"]) == \
                (t["seed"], t["score"], t["n_actions"], len(t["turns"]))
            assert e["n_actions"] == sum(turn["action"] is not None and turn["kind"] == "action"
                                         for turn in t["turns"])
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(0, STEPS + 1))
    assert "losses/actor_loss" in metrics[-1]  # after the warm-up step (bank only)
    assert any(e["phase"] == "eval" for e in episodes)
    # the bank the service wrote is the run's bank file, and retrieval ran through the service
    assert (out / "bank.sqlite").is_file()
    assert metrics[-1]["bank/size"] > 0 and any(m.get("bank/retrievals", 0) > 0 for m in metrics)
    assert any(e["with_experience"] for e in train) and any(not e["with_experience"] for e in train)
    # the extractor's model and trainer ran in their own actor (another process), and the
    # track's stats reached the loop
    import os

    assert len(started) == 1 and started[0] != os.getpid()
    assert any(k.startswith("extractor/") for k in metrics[-1])
