"""Credit for the experience extractor, and count-aware reweighting of its samples.

An *extractor sample* is one extractor call whose output the actor can use: an extraction that
wrote bank entries, a merge, or a Search-and-Ask answer. Its reward (:func:`extractor_reward`)
is known only once trajectories that used its output have finished: each credits it with
:func:`gate_credit` of its score (and the gate's verdict, when the gate is on), and

    r = mean over those trajectories of entry_outcome(credit)  (credit if > 0 else -1);
    malformed -> -1.

Until then the reward is NaN ("not resolved yet") and the sample waits in the buffer. The bank
keeps the same :func:`entry_outcome` per entry (its outcome sum and use count).

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

__all__ = ["GATE_CRITIC", "gate_credit", "entry_outcome", "extractor_reward", "extractor_rewards",
           "extractor_advantages", "count_aware_weights"]

GATE_CRITIC = {"accept": 1.0, "refine": 0.5, "reject": -1.0}
"""The gate's critic score per verdict (official ``add_memory_metadata``, see
:mod:`crl_bench.extractor.gate`)."""


def gate_credit(score: float, verdict: str | None = None) -> float:
    """The value an episode credits the entries it was shown with (before :func:`entry_outcome`).

    ``add_memory_metadata``: ``critic if critic < 1 else score + critic``; without a verdict (no
    gate) the plain score. :func:`entry_outcome` then maps it as the official buffer does
    (0 -> -1; accept and refine values are > 0 and kept).
    """
    if verdict is None:
        return float(score)
    critic = GATE_CRITIC[verdict]
    return critic if critic < 1 else float(score) + critic


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


def extractor_reward(usage: Sequence[float], malformed: bool) -> float:
    """The reward of one extractor sample: -1 when its output was malformed (whatever the usage);
    NaN while nothing has used it (not resolved); else the mean of :func:`entry_outcome` over
    ``usage``, the credit values (:func:`gate_credit`) of the trajectories that used it."""
    if malformed:
        return -1.0
    if len(usage) == 0:
        return float("nan")
    return sum(entry_outcome(s) for s in usage) / len(usage)


def extractor_rewards(usage: Sequence[Sequence[float]], malformed: Sequence[bool]) -> Tensor:
    """:func:`extractor_reward` of each extractor sample of a batch.

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
    return torch.tensor([extractor_reward(scores, bad) for scores, bad in zip(usage, malformed)],
                        dtype=torch.float32)


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
