"""Extractor credit and count-aware reweighting against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl_bench.algorithms.credit import (count_aware_weights, entry_outcome, extractor_advantages,
                                         extractor_rewards)


def test_entry_outcome():
    assert entry_outcome(1.0) == 1.0
    assert entry_outcome(0.0) == -1.0
    assert entry_outcome(0.4) == 0.4           # WebShop partial purchase keeps its credit
    assert entry_outcome(-0.2) == -1.0
    with pytest.raises(ValueError, match="leave it out"):
        entry_outcome(float("nan"))


def test_extractor_rewards_by_hand():
    usage = [
        [1.0, 0.0, 1.0],     # (1 - 1 + 1) / 3 = 1/3
        [0.5, 0.7],          # WebShop: (0.5 + 0.7) / 2 = 0.6
        [],                  # nobody used it yet -> NaN
        [1.0],               # malformed -> -1 whatever the usage
        [0.0, 0.0],          # -1
    ]
    malformed = [False, False, False, True, False]
    r = extractor_rewards(usage, malformed)
    assert r.dtype == torch.float32 and r.shape == (5,)
    torch.testing.assert_close(r[[0, 1, 3, 4]], torch.tensor([1 / 3, 0.6, -1.0, -1.0]))
    assert math.isnan(r[2].item())
    with pytest.raises(ValueError, match="one entry per extractor sample"):
        extractor_rewards(usage, malformed[:2])


def test_extractor_advantages_by_hand():
    r = torch.tensor([1 / 3, 0.6, float("nan"), -1.0, -1.0])
    adv = extractor_advantages(r)
    # baseline over the 4 resolved: (1/3 + 0.6 - 2) / 4 = -0.266666...
    b = (1 / 3 + 0.6 - 2) / 4
    torch.testing.assert_close(adv, torch.tensor([1 / 3 - b, 0.6 - b, 0.0, -1 - b, -1 - b]))
    torch.testing.assert_close(extractor_advantages(torch.full((3,), float("nan"))),
                               torch.zeros(3))


def test_count_aware_weights_by_hand():
    times = torch.tensor([0, 3, 8, 1, 2, 0])
    last = torch.tensor([-1, 5, 2, 9, 10, -1])
    w = count_aware_weights(times, last, step=10, power=0.5, cooldown=1)
    # (1+0)^-.5 = 1; (1+3)^-.5 = .5; (1+8)^-.5 = 1/3; trained at step 9 -> 10 - 9 = 1, not < 1,
    # so it trains again with (1+1)^-.5; trained at 10 (this step) -> 0 < 1 -> 0; never -> 1
    torch.testing.assert_close(w, torch.tensor([1.0, 0.5, 1 / 3, 2 ** -0.5, 0.0, 1.0]))
    w2 = count_aware_weights(times, last, step=10, power=1.0, cooldown=0)
    # cooldown 0 is off (official: ``cooldown > 0 and ...``); power 1: 1/(1+n)
    torch.testing.assert_close(w2, torch.tensor([1.0, 0.25, 1 / 9, 0.5, 1 / 3, 1.0]))
    w3 = count_aware_weights(times, last, step=10, power=0.5, cooldown=5)
    # 10 - 5 = 5, not < 5 -> (1+3)^-.5 = .5; 10 - 9 = 1 < 5 -> 0; 10 - 10 = 0 < 5 -> 0;
    # 10 - 2 = 8 -> 1/3
    torch.testing.assert_close(w3, torch.tensor([1.0, 0.5, 1 / 3, 0.0, 0.0, 1.0]))


def test_cooldown_is_strictly_less_than_as_official():
    """Issue 16, bug 1. The official ComplementaryRL fork of ROLL zeroes a sample's weight when
    ``cooldown > 0 and last_step >= 0 and (global_step - last_step) < cooldown``
    (roll/pipeline/agentic/multi_agentic_pipeline.py:923 at pUmpKin-Co/ComplementaryRL ab2574f;
    the same line in knowledge_model_pipeline.py:526), with ``memory_repeat_cooldown_steps: 1``
    in examples/singletask-agentic/single_task_complementaryrl.yaml:177. So with cooldown 1 a
    sample trained at step t is blocked at t only and trains again at t + 1."""
    times = torch.tensor([1, 1, 1, 4])
    last = torch.tensor([7, 6, 5, 4])
    for cooldown, expected in [
        (0, [2 ** -0.5, 2 ** -0.5, 2 ** -0.5, 5 ** -0.5]),   # off
        (1, [0.0, 2 ** -0.5, 2 ** -0.5, 5 ** -0.5]),          # since 0 blocked; since 1 trains
        (2, [0.0, 0.0, 2 ** -0.5, 5 ** -0.5]),                # since 0, 1 blocked; 2 trains
        (3, [0.0, 0.0, 0.0, 5 ** -0.5]),
    ]:
        w = count_aware_weights(times, last, step=7, power=0.5, cooldown=cooldown)
        torch.testing.assert_close(w, torch.tensor(expected), msg=f"cooldown {cooldown}")


def test_count_aware_weights_bad_inputs():
    t = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="same clock"):
        count_aware_weights(t, torch.tensor([-1, 11]), step=10)
    with pytest.raises(ValueError, match="power must be >= 0"):
        count_aware_weights(t, torch.tensor([-1, -1]), step=0, power=-1)
    with pytest.raises(TypeError, match="integer"):
        count_aware_weights(t.float(), torch.tensor([-1, -1]), step=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(-1, 50)), min_size=1, max_size=30),
       st.integers(50, 60), st.floats(0, 8), st.integers(0, 5))
def test_weights_are_in_unit_interval_and_zero_only_in_cooldown(rows, step, power, cooldown):
    times = torch.tensor([n for n, _ in rows])
    last = torch.tensor([s for _, s in rows])
    w = count_aware_weights(times, last, step, power=power, cooldown=cooldown)
    for (n, s), wi in zip(rows, w.tolist()):
        cooling = s >= 0 and step - s < cooldown  # official: strictly less
        if cooling:
            assert wi == 0.0
        else:
            assert 0.0 < wi <= 1.0
            assert wi == pytest.approx((1 + n) ** -power, rel=1e-5, abs=1e-37)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(-1, 1), st.just(float("nan"))), min_size=1, max_size=30))
def test_extractor_advantages_center_the_resolved_samples(values):
    r = torch.tensor(values, dtype=torch.float64)
    adv = extractor_advantages(r)
    valid = ~torch.isnan(r)
    assert not torch.isnan(adv).any()
    assert abs(float(adv[valid].sum())) < 1e-9
    assert (adv[~valid] == 0).all()


def test_defaults_and_a_sample_trained_at_step_zero():
    # defaults: power 0.5, cooldown 1 (the official values)
    w = count_aware_weights(torch.tensor([3, 0, 1]), torch.tensor([1, 0, -1]), step=1)
    # [3 trained at 1 -> 1 - 1 = 0 < 1: blocked; 0 trained at 0 -> 1 - 0 = 1: (1+0)^-.5; never]
    torch.testing.assert_close(w, torch.tensor([0.0, 1.0, 2 ** -0.5]))
    # trained at step 0 (a real step, not "never"), now step 0: blocked
    w0 = count_aware_weights(torch.tensor([1]), torch.tensor([0]), step=0, cooldown=1)
    assert w0.tolist() == [0.0]
    # a huge count never underflows to 0 (0 means cooldown only)
    big = count_aware_weights(torch.tensor([10 ** 12]), torch.tensor([-1]), step=0, power=8)
    assert big.item() > 0 and big.dtype == torch.float32


def test_every_bad_input_is_refused_with_its_message():
    """Full messages, so a caller sees what to fix."""
    import re

    def refuses(exc, message, fn, *args, **kw):
        with pytest.raises(exc, match="^" + re.escape(message) + "$"):
            fn(*args, **kw)

    refuses(ValueError, "score is NaN: an episode without an outcome gives no credit; leave it "
            "out of the usage lists", entry_outcome, float("nan"))
    refuses(ValueError, "usage has 2 samples but malformed has 1; pass one entry per extractor "
            "sample in both", extractor_rewards, [[1.0], []], [False])
    refuses(ValueError, "rewards must be a 1-D tensor [S] (one reward per extractor sample)",
            extractor_advantages, torch.zeros(2, 2))
    refuses(ValueError, "rewards must be a 1-D tensor [S] (one reward per extractor sample)",
            extractor_advantages, [1.0, 2.0])
    refuses(TypeError, "rewards must be floating, got dtype torch.int64",
            extractor_advantages, torch.tensor([1, 2]))
    t, never = torch.tensor([0, 1]), torch.tensor([-1, -1])
    refuses(ValueError, "times_trained must be a 1-D tensor [S]",
            count_aware_weights, torch.zeros(2, 1, dtype=torch.long), never, 0)
    refuses(ValueError, "last_trained_step must be a 1-D tensor [S]",
            count_aware_weights, t, [-1, -1], 0)
    refuses(TypeError, "times_trained must be an integer tensor, got dtype torch.bool",
            count_aware_weights, torch.tensor([True, False]), never, 0)
    refuses(TypeError, "last_trained_step must be an integer tensor, got dtype torch.float32",
            count_aware_weights, t, never.float(), 0)
    refuses(ValueError, "times_trained (2,) and last_trained_step (3,) must have the same length",
            count_aware_weights, t, torch.tensor([-1, -1, -1]), 0)
    refuses(ValueError, "power must be >= 0, got -0.5", count_aware_weights, t, never, 0, power=-0.5)
    refuses(ValueError, "cooldown must be >= 0 steps, got -1", count_aware_weights, t, never, 0,
            cooldown=-1)
    refuses(ValueError, "times_trained must be >= 0", count_aware_weights, torch.tensor([0, -1]),
            never, 0)
    refuses(ValueError, "last_trained_step has a step after the current step 4; both must count "
            "extractor steps on the same clock", count_aware_weights, t, torch.tensor([5, -1]), 4)
    # the bounds themselves are allowed
    assert count_aware_weights(t, torch.tensor([4, -1]), 4, power=0.0, cooldown=0).tolist() == [1.0, 1.0]
