"""Group advantages (split GRPO) against numbers worked out by hand, plus hypothesis properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl_bench.algorithms import ADVANTAGES
from crl_bench.algorithms.advantages import (broadcast_to_tokens, group_advantages, group_keys,
                                             split_group_advantages)
from crl_bench.registry import RegistryError

# One task group of 8 rollouts: the first 4 ran with experience (3 of 4 succeed, rate 0.75), the
# last 4 without (1 of 4 succeed, rate 0.25).
SCORES = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
WITH_EXP = torch.tensor([True, True, True, True, False, False, False, False])
GROUP = torch.zeros(8, dtype=torch.long)


def test_split_centres_each_half_on_its_own_mean():
    keys = group_keys(GROUP, WITH_EXP, split=True)
    assert keys[:4].unique().numel() == 1 and keys[4:].unique().numel() == 1
    assert keys[0] != keys[4]
    adv = group_advantages(SCORES, keys, "mean")
    # with half: mean 0.75 -> 1 - 0.75 = 0.25, 0 - 0.75 = -0.75
    # without half: mean 0.25 -> 1 - 0.25 = 0.75, 0 - 0.25 = -0.25
    expected = torch.tensor([0.25, 0.25, 0.25, -0.75, 0.75, -0.25, -0.25, -0.25])
    torch.testing.assert_close(adv, expected)
    assert adv[:4].sum().abs() < 1e-6 and adv[4:].sum().abs() < 1e-6


def test_unsplit_uses_the_pooled_mean_on_the_same_data():
    keys = group_keys(GROUP, WITH_EXP, split=False)
    assert keys.unique().numel() == 1
    adv = group_advantages(SCORES, keys, "mean")
    # pooled mean 4/8 = 0.5: successes +0.5, failures -0.5, whatever the experience flag
    expected = torch.tensor([0.5, 0.5, 0.5, -0.5, 0.5, -0.5, -0.5, -0.5])
    torch.testing.assert_close(adv, expected)
    # the difference the split makes: the with-experience half no longer gets a net bonus for
    # having had the bank (+1.0 summed here, 0 when split), the without half no net penalty
    assert adv[:4].sum().item() == pytest.approx(1.0)
    assert adv[4:].sum().item() == pytest.approx(-1.0)


def test_split_mean_std_by_hand():
    adv = split_group_advantages(SCORES, GROUP, WITH_EXP, split=True, method="mean_std")
    # with half deviations (.25, .25, .25, -.75): unbiased var = (3 * .0625 + .5625) / 3 = .25,
    # std .5 -> (.5, .5, .5, -1.5); the without half mirrors it: (1.5, -.5, -.5, -.5)
    expected = torch.tensor([0.5, 0.5, 0.5, -1.5, 1.5, -0.5, -0.5, -0.5])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_two_task_groups_split_gives_four_keys():
    groups = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3])
    flags = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0], dtype=torch.bool)
    keys = group_keys(groups, flags, split=True)
    assert keys.unique().numel() == 4
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.2, 0.6, 0.4, 0.6])
    adv = group_advantages(scores, keys)
    # (7, with): 1, 0 -> mean .5; (7, without): 0, 0 -> 0; (3, with): .2, .4 -> .3;
    # (3, without): .6, .6 -> .6
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.0, -0.5, 0.0, -0.1, 0.0, 0.1, 0.0]))


def test_nan_scores_are_ignored_and_singletons_get_zero():
    scores = torch.tensor([1.0, float("nan"), 0.0, 0.0, 0.5, 2.0, float("nan")])
    keys = torch.tensor([0, 0, 0, 0, 1, 2, 2])
    adv = group_advantages(scores, keys)
    # group 0 valid: 1, 0, 0 -> mean 1/3; group 1 is a singleton -> 0;
    # group 2 has one valid score left -> treated as a singleton -> 0; NaN rows -> 0
    expected = torch.tensor([2 / 3, 0.0, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected)
    assert not torch.isnan(group_advantages(scores, keys, "mean_std")).any()


def test_equal_scores_give_zero_in_both_modes():
    scores = torch.tensor([0.3, 0.3, 0.3])
    keys = torch.zeros(3, dtype=torch.long)
    for method in ("mean", "mean_std"):
        torch.testing.assert_close(group_advantages(scores, keys, method), torch.zeros(3))


def test_registry_by_name_and_unknown_name_lists_known():
    assert set(ADVANTAGES.names()) >= {"mean", "mean_std"}
    with pytest.raises(RegistryError, match="Available: mean, mean_std"):
        group_advantages(SCORES, GROUP, "median")


def test_dtype_is_kept_and_bad_inputs_are_refused():
    assert group_advantages(SCORES.double(), GROUP).dtype == torch.float64
    with pytest.raises(TypeError, match="floating"):
        group_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="one value per episode"):
        group_advantages(SCORES, GROUP[:3])
    with pytest.raises(TypeError, match="integer ids"):
        group_keys(torch.zeros(8), WITH_EXP, split=True)
    with pytest.raises(ValueError, match="eps must be > 0"):
        group_advantages(SCORES, GROUP, "mean_std", eps=0.0)


def test_broadcast_to_tokens_by_hand():
    episode_adv = torch.tensor([0.5, -0.25])
    # three turn samples: episode 0 has two turns, episode 1 one turn
    episode_index = torch.tensor([0, 0, 1])
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    out = broadcast_to_tokens(episode_adv, episode_index, mask)
    expected = torch.tensor([[0.0, 0.5, 0.5, 0.0],
                             [0.0, 0.0, 0.5, 0.5],
                             [-0.25, -0.25, -0.25, 0.0]])
    torch.testing.assert_close(out, expected)
    with pytest.raises(IndexError, match=r"\[0, 2\)"):
        broadcast_to_tokens(episode_adv, torch.tensor([0, 2, 1]), mask)
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        broadcast_to_tokens(episode_adv, episode_index, mask[:2])


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

@st.composite
def grouped_scores(draw):
    n = draw(st.integers(1, 24))
    keys = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    scores = draw(st.lists(st.one_of(st.floats(-10, 10, allow_nan=False), st.just(float("nan"))),
                           min_size=n, max_size=n))
    return torch.tensor(scores, dtype=torch.float64), torch.tensor(keys, dtype=torch.long)


@settings(max_examples=150, deadline=None)
@given(grouped_scores())
def test_mean_advantages_sum_to_zero_in_each_group(data):
    scores, keys = data
    adv = group_advantages(scores, keys, "mean")
    assert not torch.isnan(adv).any()
    for k in keys.unique():
        in_group = keys == k
        assert abs(float(adv[in_group].sum())) < 1e-9
        valid = in_group & ~torch.isnan(scores)
        if int(valid.sum()) <= 1:
            assert (adv[in_group] == 0).all()


@settings(max_examples=150, deadline=None)
@given(grouped_scores(), st.integers(0, 4), st.floats(-50, 50, allow_nan=False),
       st.sampled_from(["mean", "mean_std"]))
def test_constant_shift_of_one_group_leaves_advantages_unchanged(data, group, shift, method):
    scores, keys = data
    shifted = torch.where(keys == group, scores + shift, scores)
    before = group_advantages(scores, keys, method)
    after = group_advantages(shifted, keys, method)
    # mean_std divides by std + eps; a near-constant group can amplify float error, hence atol
    torch.testing.assert_close(after, before, atol=1e-6, rtol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=20))
def test_split_keys_are_pairs_and_unsplit_keys_are_groups(pairs):
    groups = torch.tensor([g for g, _ in pairs])
    flags = torch.tensor([f for _, f in pairs])
    split = group_keys(groups, flags, split=True)
    unsplit = group_keys(groups, flags, split=False)
    for i in range(len(pairs)):
        for j in range(len(pairs)):
            assert bool(split[i] == split[j]) == (pairs[i] == pairs[j])
            assert bool(unsplit[i] == unsplit[j]) == (pairs[i][0] == pairs[j][0])
    assert math.isclose(float(split.unique().numel()), len(set(pairs)))


def test_mean_std_pairs_eps_and_defaults_by_hand():
    # two groups of two: (1, 0) -> deviations +-.5, unbiased var = .5 / (2 - 1) = .5, std .7071
    scores = torch.tensor([1.0, 0.0, 0.2, 0.6], dtype=torch.float64)
    keys = torch.tensor([4, 4, 9, 9])
    std1, std2 = math.sqrt(0.5), math.sqrt(0.08)
    want = torch.tensor([0.5 / std1, -0.5 / std1, -0.2 / std2, 0.2 / std2], dtype=torch.float64)
    # default eps 1e-6
    torch.testing.assert_close(group_advantages(scores, keys, "mean_std"),
                               want * torch.tensor([std1, std1, std2, std2]).double()
                               / (torch.tensor([std1, std1, std2, std2]).double() + 1e-6))
    # a big eps is added to the std, not subtracted
    torch.testing.assert_close(group_advantages(scores, keys, "mean_std", eps=0.5),
                               torch.tensor([0.5 / (std1 + 0.5), -0.5 / (std1 + 0.5),
                                             -0.2 / (std2 + 0.5), 0.2 / (std2 + 0.5)],
                                            dtype=torch.float64))
    # split_group_advantages passes eps on; its defaults are split=True, method="mean"
    flags = torch.tensor([True, False, True, True])
    groups = torch.tensor([0, 0, 0, 0])
    got = split_group_advantages(scores, groups, flags, method="mean_std", eps=0.5)
    # split: (0, with) = rows 0, 2, 3 -> 1, .2, .6, mean .6, devs .4, -.4, 0, var .16, std .4;
    # (0, without) = row 1 alone -> 0
    torch.testing.assert_close(got, torch.tensor([0.4 / 0.9, 0.0, -0.4 / 0.9, 0.0], dtype=torch.float64))
    torch.testing.assert_close(split_group_advantages(scores, groups, flags),
                               torch.tensor([0.4, 0.0, -0.4, 0.0], dtype=torch.float64))


def test_empty_batch_and_single_episode_keys():
    empty = torch.zeros(0)
    no_keys = torch.zeros(0, dtype=torch.long)
    for method in ("mean", "mean_std"):
        assert group_advantages(empty, no_keys, method).shape == (0,)
    assert group_keys(no_keys, torch.zeros(0, dtype=torch.bool), split=True).shape == (0,)
    # a single episode still gets a compact key (0), not its task group id
    assert group_keys(torch.tensor([5]), torch.tensor([True]), split=True).tolist() == [0]
    # integer ids of any width come back as long
    k = group_keys(torch.tensor([3, 3], dtype=torch.int32), torch.tensor([1, 0]), split=False)
    assert k.dtype == torch.long and k.tolist() == [3, 3]
    with pytest.raises(ValueError, match=r"^with_experience must be bool \(or 0/1\)$"):
        group_keys(torch.tensor([0, 0]), torch.tensor([0, 2]), split=True)


def test_input_errors_name_the_argument():
    import re

    def refuses(exc, message, fn, *args):
        with pytest.raises(exc, match="^" + re.escape(message) + "$"):
            fn(*args)

    refuses(TypeError, "task_group must be a torch.Tensor, got list", group_keys, [0], WITH_EXP, True)
    refuses(ValueError, "task_group must be 1-D (one value per episode), got shape (2, 4)",
            group_keys, GROUP.view(2, 4), WITH_EXP, True)
    refuses(ValueError, "with_experience has 3 entries but scores/task_group has 8; pass one value "
            "per episode, in the same order", group_keys, GROUP, WITH_EXP[:3], True)
    refuses(TypeError, "scores must be a torch.Tensor, got list", group_advantages, [1.0], GROUP[:1])
    refuses(ValueError, "keys has 3 entries but scores/task_group has 8; pass one value per "
            "episode, in the same order", group_advantages, SCORES, GROUP[:3])
    refuses(ValueError, "episode_adv must be 1-D (one value per episode), got shape (1, 2)",
            broadcast_to_tokens, torch.zeros(1, 2), torch.tensor([0]), torch.ones(1, 2))
    refuses(ValueError, "episode_index must be 1-D (one value per episode), got shape (1, 1)",
            broadcast_to_tokens, torch.zeros(2), torch.tensor([[0]]), torch.ones(1, 2))
    refuses(TypeError, "episode_index must be integer, got dtype torch.float32",
            broadcast_to_tokens, torch.zeros(2), torch.tensor([0.0]), torch.ones(1, 2))
    refuses(TypeError, "episode_index must be integer, got dtype torch.bool",
            broadcast_to_tokens, torch.zeros(2), torch.tensor([True]), torch.ones(1, 2))
    # int32 indices and a 0/1 integer mask work and keep the advantage's dtype
    out = broadcast_to_tokens(torch.tensor([0.5, -1.0], dtype=torch.float64),
                              torch.tensor([1, 0], dtype=torch.int32), torch.tensor([[1, 0], [1, 1]]))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0], [0.5, 0.5]], dtype=torch.float64))


def test_estimators_called_directly_use_their_own_default_eps():
    from crl_bench.algorithms.advantages import mean_advantages, mean_std_advantages

    scores = torch.tensor([1.0, 0.0], dtype=torch.float64)
    keys = torch.tensor([0, 0])
    s = math.sqrt(0.5)
    torch.testing.assert_close(mean_std_advantages(scores, keys),
                               torch.tensor([0.5 / (s + 1e-6), -0.5 / (s + 1e-6)], dtype=torch.float64))
    torch.testing.assert_close(mean_advantages(scores, keys),
                               torch.tensor([0.5, -0.5], dtype=torch.float64))
