"""The expert (each game's stored walkthrough) replayed through the env's text actions wins.

CI plays a fixed sample: 4 valid_unseen games and 2 train games of each of the six task types.
The full 134 valid_unseen games (and a larger train sample) are played by
``experiments/alfworld_expert.py``.
"""

from __future__ import annotations

import pytest
from _data_paths import missing_data_reason, shared_data_dir

pytest.importorskip("textworld", reason="the alfworld extra is not installed")
pytest.importorskip("alfworld", reason="the alfworld extra is not installed")

from crl_bench.envs.alfworld.env import ALFWorldTextEnv
from crl_bench.envs.alfworld.expert import (
    replay_walkthrough,
    sample_per_task_type,
    win_rates,
)
from crl_bench.envs.alfworld.games import TASK_TYPES

DATA = shared_data_dir("alfworld")
pytestmark = pytest.mark.skipif(DATA is None, reason=missing_data_reason("alfworld"))


def test_sample_per_task_type_is_fixed_and_covers_all_types() -> None:
    env = ALFWorldTextEnv(split="valid_unseen", data_dir=DATA)
    sample = sample_per_task_type(env.games, per_type=4, seed=0)
    assert sample == sample_per_task_type(list(reversed(env.games)), per_type=4, seed=0)
    assert len(sample) == 24 and sample != sample_per_task_type(env.games, per_type=4, seed=1)
    types = [env._record_for(t).task_type for t in sample]
    assert {t: types.count(t) for t in set(types)} == {t: 4 for t in TASK_TYPES.values()}


@pytest.mark.slow
@pytest.mark.parametrize("split,per_type", [("valid_unseen", 4), ("train", 2)])
def test_walkthrough_expert_wins_every_sampled_game(split: str, per_type: int) -> None:
    env = ALFWorldTextEnv(split=split, data_dir=DATA)
    sample = sample_per_task_type(env.games, per_type=per_type, seed=0)
    env.prefetch(sample[1:])
    episodes = [replay_walkthrough(env, task_id) for task_id in sample]
    env.close()
    rates = win_rates(episodes)
    lost = [(e.task_id, e.steps, e.invalid_actions) for e in episodes if not e.won]
    assert not lost, f"the walkthrough lost {lost}"
    assert rates["all"] == (6 * per_type, 6 * per_type)
    assert all(rates[t] == (per_type, per_type) for t in TASK_TYPES.values())
    assert all(e.invalid_actions == 0 and e.total_reward == 1.0 and 3 <= e.steps <= 10
               for e in episodes)
