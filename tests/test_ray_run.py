"""A `tiny` run on a local Ray cluster (2 env workers, 1 generation engine, 2 gloo learner ranks)
against the same run in one process: in the synchronous mode every trajectory (tokens, actions,
observations, rewards) is the same, and the metrics agree (timings aside; floats within fp32
tolerance: the learner sums its gradient across ranks in another order). Plus the resource-plan
check at start. One Ray cluster for the module."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_bench.distributed.plan import (PLANS, ResourcePlan, ResourcePlanError,  # noqa: E402
                                        check_plan, get_plan)

AGENT, TASKS, STEPS = "grpo", "minihack", 2
VOLATILE = ("time", "timing_s/", "memory/")


def volatile(key: str) -> bool:
    """Wall-clock figures, and the single-process trainer's time in recompute / forward /
    backward, which the Ray learner does not report (its token counts it does: compared)."""
    return key.startswith(VOLATILE) or "_time_" in key


@pytest.fixture(scope="module")
def cluster():
    with local_ray(4):
        yield


def run(out: Path, ray_opts=None) -> Path:
    import torch

    from crl_bench.runner.api import run_experiment

    torch.set_num_threads(1)
    return run_experiment(AGENT, TASKS, "tiny", 0, out, steps=STEPS, overrides={"threads": 1},
                          progress=False, ray=ray_opts)


def lines(path: Path) -> list[dict]:
    import gzip

    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def close(a, b, where: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), f"{where}: {a} != {b}"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def strip_episode(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "wall_s"}


def strip_traj(d: dict) -> dict:
    d = {k: v for k, v in d.items() if k != "wall_s"}
    return d


def test_plan_check_names_what_is_missing():
    with pytest.raises(ResourcePlanError) as err:
        check_plan(PLANS["paper16-split"], {"CPU": 8.0, "GPU": 2.0})
    msg = str(err.value)
    assert "paper16-split" in msg and "16 GPU" in msg and "14 GPU missing" in msg
    assert "actor generation engine 4" in msg and "extractor generation engine 4" in msg
    assert "extractor learner rank 4" in msg
    # colocated (paper16): a role's GPUs each hold an engine's share and a learner rank
    with pytest.raises(ResourcePlanError) as err:
        check_plan(PLANS["paper16"], {"CPU": 8.0, "GPU": 2.0})
    msg = str(err.value)
    assert "16 GPU" in msg and "14 GPU missing" in msg
    assert "actor GPU (an engine's share and a learner rank) 8" in msg
    assert "extractor GPU (an engine's share and a learner rank) 8" in msg
    check_plan(PLANS["cpu"], {"CPU": 2.0})  # fits: no error
    # enough GPUs in total, but no single node holds a 2-GPU generation engine
    plan = ResourcePlan(name="tp2", actor_generation_gpus=2, generation_engines=1, env_workers=1)
    with pytest.raises(ResourcePlanError, match="one actor generation engine needs 1 CPU, 2 GPU"):
        check_plan(plan, {"CPU": 4, "GPU": 2}, nodes=[{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}])
    assert get_plan("cpu", env_workers=4).env_workers == 4
    with pytest.raises(ValueError, match="unknown ray plan"):
        get_plan("nope")


def test_plan_checked_against_the_live_cluster(cluster, tmp_path):
    from crl_bench.distributed.plan import check_plan_against_ray

    with pytest.raises(ResourcePlanError, match="GPU missing"):
        check_plan_against_ray(PLANS["gpu1"])
    with pytest.raises(ResourcePlanError, match="CPU missing"):
        check_plan_against_ray(get_plan("cpu", env_workers=40, cpus_per_env_worker=1))


def test_ray_tiny_run_equals_single_process(cluster, tmp_path):
    ref = run(tmp_path / "single")
    got = run(tmp_path / "ray", {"plan": "cpu"})  # 2 env workers, 1 engine, 2 learner ranks
    assert PLANS["cpu"].env_workers == 2 and PLANS["cpu"].learner_ranks == 2
    for name in ("episodes.jsonl",):
        a, b = lines(ref / name), lines(got / name)
        assert len(a) == len(b) > 0
        close([strip_episode(x) for x in a], [strip_episode(x) for x in b], name)
    train = [e for e in lines(got / "episodes.jsonl") if e["phase"] == "train"]
    assert sorted({e["step"] for e in train}) == list(range(1, STEPS + 1))
    assert sum(e["n_actions"] for e in train) > 0  # envs really stepped (remotely)
    ta = sorted(p.relative_to(ref) for p in (ref / "trajectories").glob("*.jsonl.gz"))
    tb = sorted(p.relative_to(got) for p in (got / "trajectories").glob("*.jsonl.gz"))
    assert ta == tb and ta
    for rel in ta:
        a, b = lines(ref / rel), lines(got / rel)
        close([strip_traj(x) for x in a], [strip_traj(x) for x in b], str(rel))
    ma = [{k: v for k, v in m.items() if not volatile(k)} for m in lines(ref / "metrics.jsonl")]
    mb = [{k: v for k, v in m.items() if not volatile(k)} for m in lines(got / "metrics.jsonl")]
    close(ma, mb, "metrics.jsonl")
    assert any("losses/actor_loss" in m and m["losses/actor_loss"] != 0 for m in mb)


def test_cli_ray_options(monkeypatch, tmp_path):
    """`crl-bench run --ray [ADDRESS] --ray-plan P` reaches run_experiment as its ray= argument."""
    from crl_bench import cli
    from crl_bench.runner import api

    seen = []

    def fake(*args, **kwargs):
        seen.append(kwargs.get("ray"))
        raise SystemExit(0)

    monkeypatch.setattr(api, "run_experiment", fake)
    for argv, want in ((["--ray"], {"address": None, "plan": "cpu"}),
                       (["--ray", "10.0.0.1:6379", "--ray-plan", "paper16"],
                        {"address": "10.0.0.1:6379", "plan": "paper16"}),
                       ([], None)):
        with pytest.raises(SystemExit):
            cli.main(["run", "--agent", "grpo", "--tasks", "minihack", "--out",
                      str(tmp_path / "x"), *argv])
        assert seen[-1] == want
