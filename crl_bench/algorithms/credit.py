"""Credit for the experience extractor, and count-aware reweighting of its samples.

An *extractor sample* is one extractor call whose output the actor can use: an extraction that
wrote bank entries, or a Search-and-Ask answer. Its reward is known only once trajectories that
used its output have finished: r = mean over those trajectories of (score if score > 0 else -1).
Until then the reward is NaN ("not resolved yet") and the sample waits in the buffer.

Count-aware reweighting keeps a few popular samples from dominating the extractor's updates: a
sample trained n times before has its advantage scaled by (1 + n)^-power, and a sample trained
fewer than ``cooldown`` steps ago is skipped (weight 0), as in the official code
(ComplementaryRL fork of ROLL, ``roll/pipeline/agentic/multi_agentic_pipeline.py``:
``cooldown > 0 and last_step >= 0 and (global_step - last_step) < cooldown``).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["entry_outcome", "extractor_rewards", "extractor_advantages", "count_aware_weights"]


def entry_outcome(score: float) -> float:
    """One trajectory's verdict on the experience it used: ``score`` if ``score > 0`` else -1.

    For success/failure tasks (score 0 or 1) this is ±1; for WebShop (score in [0, 1]) a partial
    purchase keeps its fractional credit and a zero-score episode counts as a failure (-1).

    Raises:
        ValueError: ``score`` is NaN (an episode without an outcome cannot give credit; leave it
            out of ``usage``).
    """
    score = float(score)
    if math.isnan(score):
        raise ValueError("score is NaN: an episode without an outcome gives no credit; "
                         "leave it out of the usage lists")
    return score if score > 0 else -1.0


def extractor_rewards(usage: Sequence[Sequence[float]], malformed: Sequence[bool]) -> Tensor:
    """Reward of each extractor sample from the trajectories that used what it produced.

    Args:
        usage: length S; ``usage[s]`` are the scores of the finished trajectories that used
            sample s's output (a bank entry it wrote, or its Search-and-Ask answer). Empty if
            nothing has used it yet.
        malformed: length S; True if sample s's output could not be parsed / applied.

    Returns:
        ``[S]`` float32 rewards in [-1, 1]:
        - malformed -> -1 (whatever the usage: a broken output is always penalised);
        - no usage yet -> NaN: the credit is *not resolved*; keep the sample until some
          trajectory uses its output (or drop it), do not train on it;
        - otherwise the mean of :func:`entry_outcome` over ``usage[s]``.
    """
    if len(usage) != len(malformed):
        raise ValueError(f"usage has {len(usage)} samples but malformed has {len(malformed)}; "
                         "pass one entry per extractor sample in both")
    out = []
    for scores, bad in zip(usage, malformed):
        if bad:
            out.append(-1.0)
        elif len(scores) == 0:
            out.append(float("nan"))
        else:
            out.append(sum(entry_outcome(s) for s in scores) / len(scores))
    return torch.tensor(out, dtype=torch.float32)


def extractor_advantages(rewards: Tensor) -> Tensor:
    """Advantage = reward - mean reward of the batch (over the resolved, non-NaN samples).

    Args:
        rewards: ``[S]`` float rewards from :func:`extractor_rewards`; NaN = unresolved.

    Returns:
        ``[S]`` advantages, same dtype. Unresolved (NaN) samples get 0 so they add no gradient;
        better still, leave them out of the training batch, since they would still count in a
        token-mean's denominator. All-NaN input gives all zeros.
    """
    if not isinstance(rewards, Tensor) or rewards.dim() != 1:
        raise ValueError("rewards must be a 1-D tensor [S] (one reward per extractor sample)")
    if not rewards.dtype.is_floating_point:
        raise TypeError(f"rewards must be floating, got dtype {rewards.dtype}")
    valid = ~torch.isnan(rewards)
    if not bool(valid.any()):
        return torch.zeros_like(rewards)
    baseline = rewards[valid].mean()
    return torch.where(valid, rewards - baseline, torch.zeros_like(rewards))


def count_aware_weights(times_trained: Tensor, last_trained_step: Tensor, step: int,
                        power: float = 0.5, cooldown: int = 1) -> Tensor:
    """Per-sample weight on the extractor advantage: ``(1 + n)^-power``, 0 during cooldown.

    Args:
        times_trained: ``[S]`` integer, how many updates each sample has already been used in.
        last_trained_step: ``[S]`` integer, the extractor step at which it was last used,
            -1 = never.
        step: the current extractor step (same clock as ``last_trained_step``).
        power: decay exponent, >= 0 (official 0.5; 0 turns the count decay off).
        cooldown: a sample with ``0 <= step - last_trained_step < cooldown`` gets weight 0
            (strictly less, as official). The official config uses 1: a sample cannot be trained
            twice at the same step, but may be trained again at the next one. 0 turns the
            cooldown off.

    Returns:
        ``[S]`` float32 weights; in (0, 1] outside cooldown, exactly 0 inside it.
    """
    for name, t in (("times_trained", times_trained), ("last_trained_step", last_trained_step)):
        if not isinstance(t, Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor [S]")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if times_trained.shape != last_trained_step.shape:
        raise ValueError(f"times_trained {tuple(times_trained.shape)} and last_trained_step "
                         f"{tuple(last_trained_step.shape)} must have the same length")
    if power < 0:
        raise ValueError(f"power must be >= 0, got {power}")
    if cooldown < 0:
        raise ValueError(f"cooldown must be >= 0 steps, got {cooldown}")
    if times_trained.numel() and int(times_trained.min()) < 0:
        raise ValueError("times_trained must be >= 0")
    if last_trained_step.numel() and int(last_trained_step.max()) > step:
        raise ValueError(f"last_trained_step has a step after the current step {step}; "
                         "both must count extractor steps on the same clock")
    n = times_trained.to(torch.float64)
    # floor at float32's smallest normal so a huge count never underflows to a cooldown-like 0
    weights = (1.0 + n).pow(-float(power)).clamp(min=torch.finfo(torch.float32).tiny)
    since = step - last_trained_step.to(torch.long)
    cooling = (last_trained_step >= 0) & (since < cooldown)
    weights = torch.where(cooling, torch.zeros_like(weights), weights)
    return weights.to(torch.float32)
