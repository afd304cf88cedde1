"""Training levels never overlap the held-out evaluation levels, for any run seed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crl_bench.mixes import BUILTIN_MIXES, EVAL_SEED_BLOCK
from crl_bench.run.context import train_seed
from crl_bench.config.validation import MAX_EPISODES_PER_STEP

OFFSET = 1_000_000  # every built-in task's eval_seed_offset


def test_every_builtin_task_reserves_the_same_block_and_it_holds_any_evaluation() -> None:
    assert {t.eval_seed_offset for mix in BUILTIN_MIXES.values() for t in mix} == {OFFSET}
    assert MAX_EPISODES_PER_STEP < EVAL_SEED_BLOCK  # eval.episodes_per_task is capped by it


def test_run_seed_1_no_longer_trains_on_the_evaluation_levels() -> None:
    """The regression: seed * 1_000_003 + index put run seed 1's groups on seeds 1,000,003 and
    up — the held-out levels 3, 4, ... of every evaluation with more than 3 episodes."""
    held_out = set(range(OFFSET, OFFSET + 64))
    assert {1 * 1_000_003 + i for i in range(64)} & held_out  # the old formula's overlap
    assert not {train_seed(1, i, OFFSET) for i in range(100_000)} & held_out
    assert [train_seed(0, i, OFFSET) for i in range(5)] == [0, 1, 2, 3, 4]  # seed 0 unchanged


@given(st.integers(0, 2**31 - 1), st.integers(0, 10**9))
def test_no_training_seed_lands_in_the_reserved_block(run_seed: int, index: int) -> None:
    seed = train_seed(run_seed, index, OFFSET)
    assert not OFFSET <= seed < OFFSET + EVAL_SEED_BLOCK


def test_different_runs_or_groups_play_different_levels() -> None:
    """One-to-one: the first 20,000 groups of run seeds 0-4 (seed 1's cross the old overlap at
    index 0 and the shift) are 100,000 different levels, none in the reserved block."""
    seeds = [train_seed(s, i, OFFSET) for s in range(5) for i in range(20_000)]
    assert len(set(seeds)) == len(seeds)
    assert not [x for x in seeds if OFFSET <= x < OFFSET + EVAL_SEED_BLOCK]
