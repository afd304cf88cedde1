"""Token-level policy losses: PPO clipped surrogate (actor) and CISPO (extractor).

Every loss takes four ``[N, T]`` tensors — ``N`` turn samples (one model call each), ``T`` token
positions — aligned on the sampled completion tokens:

- ``logprobs``: log π_θ(token) under the current parameters (carries the gradient), nats;
- ``old_logprobs``: log-probs of the same tokens under the sampling policy (no gradient), nats;
- ``advantages``: advantage per token (see ``broadcast_to_tokens``);
- ``mask``: bool or 0/1, True on tokens that are trained.

and returns ``(loss, metrics)``: a scalar to minimise and a dict of float diagnostics over the
masked tokens. The difference that matters: PPO's clipped branch has *zero* gradient for a token
whose ratio left the trust region in the direction of its advantage; CISPO clips only the
stop-gradient importance weight, so every token keeps ``clip(ratio) * A * grad log π``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from typing import get_args

from crl_bench.algorithms import LOSSES, Aggregation, loss_arg_ranges
from crl_bench.algorithms.ranges import check_args

__all__ = ["LOSSES", "AGGREGATION_MODES", "aggregate", "ppo_clip_loss", "cispo_loss", "kl_k3",
           "entropy_from_logits"]

AGGREGATION_MODES: tuple[str, ...] = get_args(Aggregation)

# exp() of a log-ratio past this overflows float32 long before it means anything; tokens this far
# off-policy are clipped anyway, so clamping the log-ratio changes no clipped value.
_MAX_LOG_RATIO = 20.0


def _check_token_tensors(**tensors: Tensor) -> tuple[int, int]:
    shape = None
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be [N, T] (turn samples x tokens), "
                             f"got shape {tuple(t.shape)}")
        if shape is None:
            shape = tuple(t.shape)
        elif tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but the other token tensors have "
                             f"{shape}; pad all of them to the same [N, T]")
    assert shape is not None
    return shape  # type: ignore[return-value]


def aggregate(values: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce per-token values ``[N, T]`` to a scalar over the masked tokens.

    Modes:
        ``token-mean``: sum over all masked tokens / number of masked tokens (every token weighs
            the same; long completions weigh more).
        ``seq-mean-token-mean``: mean over tokens inside each sequence, then mean over sequences
            (every sequence weighs the same).
        ``seq-mean-token-sum``: sum over tokens inside each sequence, then mean over sequences.

    Sequences with no masked token are left out of the sequence means (a padded row must not
    pull the mean towards 0). With no masked token at all the result is 0, still attached to
    the graph so ``backward()`` works.

    Args:
        values: ``[N, T]`` per-token values.
        mask: ``[N, T]`` bool or 0/1.
        mode: one of :data:`AGGREGATION_MODES`.

    Returns:
        0-dim tensor, dtype of ``values``.
    """
    _check_token_tensors(values=values, mask=mask)
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"Unknown aggregation mode {mode!r}. Available: "
                         f"{', '.join(AGGREGATION_MODES)}.")
    m = mask.to(values.dtype)
    # where(), not values * m: padding positions may hold inf/NaN log-probs, and NaN * 0 = NaN
    masked = torch.where(mask.to(torch.bool), values, torch.zeros_like(values))
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1)
    tokens_per_seq = m.sum(dim=1)
    seq_sum = masked.sum(dim=1)
    has_tokens = tokens_per_seq > 0
    per_seq = seq_sum / tokens_per_seq.clamp(min=1) if mode == "seq-mean-token-mean" else seq_sum
    n_seq = has_tokens.to(values.dtype).sum().clamp(min=1)
    return (per_seq * has_tokens.to(values.dtype)).sum() / n_seq


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    b = mask.to(torch.bool)
    return float(values[b].double().mean()) if bool(b.any()) else 0.0


def _masked_max(values: Tensor, mask: Tensor) -> float:
    b = mask.to(torch.bool)
    return float(values[b].max()) if bool(b.any()) else 0.0


def _ratio(logprobs: Tensor, old_logprobs: Tensor) -> tuple[Tensor, Tensor]:
    log_ratio = (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return log_ratio, torch.exp(log_ratio)


def _shared_metrics(log_ratio: Tensor, ratio: Tensor, mask: Tensor) -> dict[str, float]:
    with torch.no_grad():
        # k3 estimate of KL(old || new) on tokens sampled from old: (r - 1) - log r >= 0
        k3 = (ratio - 1) - log_ratio
        return {"approx_kl": _masked_mean(k3, mask),
                "ratio_mean": _masked_mean(ratio, mask),
                "ratio_max": _masked_max(ratio, mask),
                "n_tokens": float(mask.to(torch.float32).sum())}


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                  clip_eps: float = 0.2, clip_eps_high: float | None = None,
                  dual_clip: float | None = None,
                  agg: str = "token-mean") -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate: per token ``max(-A r, -A clip(r, 1 - eps, 1 + eps_high))``.

    ``r = exp(logprobs - old_logprobs)``. The ``max`` of the two negated terms is PPO's
    pessimistic bound: when ``r`` has already moved past the clip edge in the direction that ``A``
    favours, the clipped (constant) term wins and the token's gradient is 0.

    Args:
        logprobs, old_logprobs, advantages, mask: ``[N, T]``; see the module docstring.
        clip_eps: lower clip, ratio floor ``1 - clip_eps`` (official 0.2).
        clip_eps_high: upper clip, ratio ceiling ``1 + clip_eps_high``; None = ``clip_eps``
            (set it higher for DAPO's "clip-higher").
        dual_clip: if set (must be > 1), tokens with ``A < 0`` have their loss capped at
            ``-A * dual_clip`` so a huge ratio on a bad token cannot blow the update up.
        agg: aggregation mode, see :func:`aggregate`.

    Returns:
        ``(loss, metrics)``. metrics (over masked tokens): ``clip_frac`` (share of tokens on the
        clipped branch, i.e. with zero gradient), ``clip_frac_low`` / ``clip_frac_high`` (ratio
        below the floor / above the ceiling), ``dual_clip_frac``, ``approx_kl`` (k3 estimate of
        KL(old || new), nats/token), ``ratio_mean``, ``ratio_max``, ``n_tokens``.
    """
    _check_token_tensors(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
                         mask=mask)
    # the ranges this loss registers (crl_bench.algorithms); the run configuration checks the same
    check_args("ppo_clip", loss_arg_ranges("ppo_clip"), clip_eps=clip_eps,
               clip_eps_high=clip_eps_high, dual_clip=dual_clip)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    old = old_logprobs.detach()
    adv = advantages.detach()
    log_ratio, ratio = _ratio(logprobs, old)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_eps, 1 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_active = (adv < 0) & (per_token > cap)
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)
    loss = aggregate(per_token, mask, agg)

    with torch.no_grad():
        on_clipped = (clipped > unclipped).to(torch.float32)
        metrics = {
            "clip_frac": _masked_mean(on_clipped, mask),
            "clip_frac_low": _masked_mean((ratio < 1 - clip_eps).float(), mask),
            "clip_frac_high": _masked_mean((ratio > 1 + eps_high).float(), mask),
            "dual_clip_frac": _masked_mean(dual_active.float(), mask),
        }
    metrics.update(_shared_metrics(log_ratio, ratio, mask))
    return loss, metrics


def cispo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
               eps_low: float = 0.1, eps_high: float = 0.1, one_sided: bool = False,
               agg: str = "token-mean") -> tuple[Tensor, dict[str, float]]:
    """CISPO: per token ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logprobs``.

    The importance weight is clipped and detached; the gradient flows through ``logprobs`` only,
    so ``d loss / d theta = -clip(r) * A * grad log pi`` for *every* masked token — no token is
    dropped, which keeps long extractor outputs learning.

    Args:
        logprobs, old_logprobs, advantages, mask: ``[N, T]``; see the module docstring.
        eps_low: weight floor ``1 - eps_low`` (official 0.1).
        eps_high: weight ceiling ``1 + eps_high`` (official 0.1).
        one_sided: True -> cap the weight from above only (``min(r, 1 + eps_high)``), the
            MiniMax-M1 form; ``eps_low`` is then ignored.
        agg: aggregation mode, see :func:`aggregate`.

    Returns:
        ``(loss, metrics)``. metrics (over masked tokens): ``clip_frac`` (share whose weight was
        clipped), ``clip_frac_low``, ``clip_frac_high``, ``weight_mean``, ``approx_kl``,
        ``ratio_mean``, ``ratio_max``, ``n_tokens``.
    """
    _check_token_tensors(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
                         mask=mask)
    check_args("cispo", loss_arg_ranges("cispo"), eps_high=eps_high,
               eps_low=None if one_sided else eps_low)  # eps_low is unused one-sided
    old = old_logprobs.detach()
    adv = advantages.detach()
    log_ratio, ratio = _ratio(logprobs.detach(), old)
    low = None if one_sided else 1 - eps_low
    weight = ratio.clamp(min=low, max=1 + eps_high)
    per_token = -weight * adv * logprobs
    loss = aggregate(per_token, mask, agg)

    with torch.no_grad():
        below = (ratio < low).float() if low is not None else torch.zeros_like(ratio)
        above = (ratio > 1 + eps_high).float()
        metrics = {
            "clip_frac": _masked_mean(torch.clamp(below + above, max=1), mask),
            "clip_frac_low": _masked_mean(below, mask),
            "clip_frac_high": _masked_mean(above, mask),
            "weight_mean": _masked_mean(weight, mask),
        }
    metrics.update(_shared_metrics(log_ratio, ratio, mask))
    return loss, metrics


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_θ || π_ref) on tokens sampled from π_θ.

    ``k3 = exp(ref - logp) - (ref - logp) - 1``: unbiased, always >= 0, low variance
    (Schulman, "Approximating KL divergence"). The log-ratio is clamped to ±20 for stability.

    Args:
        logprobs: ``[...]`` log π_θ of the sampled tokens (gradient flows), nats.
        ref_logprobs: ``[...]`` log π_ref of the same tokens (no gradient), nats.

    Returns:
        ``[...]`` per-token KL estimate in nats; aggregate it with :func:`aggregate` and add
        ``kl_coef *`` it to the loss.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs "
                         f"{tuple(ref_logprobs.shape)} must have the same shape")
    log_r = (ref_logprobs.detach() - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(log_r) - log_r - 1


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position.

    Args:
        logits: ``[..., V]`` unnormalised log-probs over the vocabulary.

    Returns:
        ``[...]`` entropy in nats (``logsumexp(z) - sum softmax(z) * z``). Subtract
        ``entropy_coef * aggregate(entropy, mask)`` from the loss for an entropy bonus.
    """
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension [..., V]")
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
