"""An oracle that knows the goal's product and options, but acts only through text actions,
buys a reward-1.0 product on at least 95% of 200 test goals: the search, the pages and the
purchase path work end to end."""

from __future__ import annotations

import gymnasium
import pytest

import crl_bench  # noqa: F401
from _data_paths import missing_data_reason, shared_data_dir
from crl_bench.envs.webshop.oracle import run_oracle_episode

DATA = shared_data_dir("webshop")
pytestmark = pytest.mark.skipif(DATA is None, reason=missing_data_reason("webshop"))


def test_oracle_solves_at_least_95_percent_of_200_test_goals():
    env = gymnasium.make("crl/WebShop-v0", split="test", data_dir=str(DATA))
    task_ids = env.unwrapped.task_ids()[:200]
    episodes = [run_oracle_episode(env, task_id) for task_id in task_ids]
    successes = sum(ep["success"] for ep in episodes)
    assert successes / len(episodes) >= 0.95, [
        (ep["task_id"], ep["score"], ep["actions"]) for ep in episodes if not ep["success"]][:5]
    # every action the oracle took was understood, and it stayed inside the 15-step budget
    assert all(len(ep["actions"]) <= 15 for ep in episodes)
    assert all(ep["success"] == (ep["score"] == 1.0) for ep in episodes)


def test_a_wrong_purchase_scores_below_one():
    env = gymnasium.make("crl/WebShop-v0", split="test", data_dir=str(DATA))
    _obs, info = env.reset(options={"task_id": 490})
    env.step("search[tempered glass screen protector]")
    env.step("click[b083zk4nrs]")
    _obs, reward, terminated, _tr, info = env.step("click[buy now]")
    assert terminated and reward < 0.5 and not info["success"]


def test_exact_purchase_ceiling_per_split_matches_real_webshop():
    # Issue 17: in real WebShop, 458 of the 6,910 synthetic goals score below 1.0 even when the
    # goal's product is bought with exactly the goal's options (20 test, 72 eval, 366 train).
    from crl_bench.envs.webshop.data import load_webshop_data
    from crl_bench.envs.webshop.oracle import exact_purchase_ceiling

    table = exact_purchase_ceiling(load_webshop_data(DATA))
    assert {s: (r["goals"], r["below_1"]) for s, r in table.items()} == {
        "test": (500, 20), "eval": (1000, 72), "train": (5410, 366), "all": (6910, 458)}
