"""Episode outcome -> advantage, inside task groups (GRPO), with the paper's experience split.

A *task group* is the K rollouts of one task instance in one training step. With the split on,
half of them ran with retrieved experience and half without; the two halves have different
success rates, so each half is centred on its own mean. Centring on the pooled mean would hand
every with-experience rollout a positive advantage just for having had the bank — the paper's
ablation shows training collapses that way.

Shapes: ``B`` episodes, ``N`` turn samples (one per model call), ``T`` tokens per turn sample.
"""

from __future__ import annotations

import torch
from torch import Tensor

from crl_bench.algorithms import ADVANTAGES

__all__ = ["ADVANTAGES", "group_keys", "group_advantages", "mean_advantages",
           "mean_std_advantages", "split_group_advantages", "broadcast_to_tokens"]


def _check_1d(name: str, t: Tensor, length: int | None = None) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D (one value per episode), got shape {tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} has {t.shape[0]} entries but scores/task_group has {length}; "
                         "pass one value per episode, in the same order")


def group_keys(task_group: Tensor, with_experience: Tensor, split: bool) -> Tensor:
    """The grouping key of each episode for advantage computation.

    Args:
        task_group: ``[B]`` integer id of the task group (same task instance, same step) of each
            episode.
        with_experience: ``[B]`` bool, True if the episode ran with retrieved experience.
        split: True -> one group per (task group, with_experience) pair (split GRPO);
            False -> one group per task group.

    Returns:
        ``[B]`` long keys; equal keys share a baseline. With ``split`` the keys are compact ids
        ``0..G-1`` of the distinct pairs; without it, ``task_group`` itself (as long).
    """
    _check_1d("task_group", task_group)
    _check_1d("with_experience", with_experience, task_group.shape[0])
    if task_group.dtype.is_floating_point or task_group.dtype == torch.bool:
        raise TypeError(f"task_group must hold integer ids, got dtype {task_group.dtype}")
    groups = task_group.to(torch.long)
    if not split:
        return groups.clone()
    flags = with_experience.to(torch.long)
    if ((flags != 0) & (flags != 1)).any():
        raise ValueError("with_experience must be bool (or 0/1)")
    if groups.numel() == 0:
        return groups.clone()
    pairs = torch.stack([groups, flags], dim=1)
    _, keys = torch.unique(pairs, dim=0, return_inverse=True)
    return keys.to(torch.long)


def _group_stats(scores: Tensor, keys: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(clean scores with NaN -> 0, valid mask, per-episode group count, per-episode group mean)."""
    _check_1d("scores", scores)
    if not scores.dtype.is_floating_point:
        raise TypeError(f"scores must be a floating tensor, got dtype {scores.dtype}")
    _check_1d("keys", keys, scores.shape[0])
    _, inv = torch.unique(keys, return_inverse=True)
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    valid = ~torch.isnan(scores)
    clean = torch.where(valid, scores, torch.zeros_like(scores))
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    count.index_add_(0, inv, valid.to(scores.dtype))
    total = torch.zeros_like(count).index_add_(0, inv, clean)
    mean = total / count.clamp(min=1)
    return clean, valid, count[inv], mean[inv]


def mean_advantages(scores: Tensor, keys: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Advantage = score - mean score of the episode's group (the official code; no std).

    Args:
        scores: ``[B]`` float outcome per episode (success 0/1, or a fractional score). NaN marks
            an episode with no outcome (crashed, unfinished): it is left out of its group's mean
            and gets advantage 0.
        keys: ``[B]`` integer group keys (see :func:`group_keys`).
        eps: unused here; accepted so every estimator has the same signature.

    Returns:
        ``[B]`` advantages in the units of ``scores``, same dtype. A group with fewer than two
        valid episodes has no baseline to compare against: its advantages are 0 (no gradient),
        rather than the raw score, which would reward whatever the lone rollout did.
    """
    del eps
    clean, valid, count, mean = _group_stats(scores, keys)
    adv = clean - mean
    return torch.where(valid & (count > 1), adv, torch.zeros_like(adv))


def mean_std_advantages(scores: Tensor, keys: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Advantage = (score - group mean) / (group std + eps), the GRPO paper's normalisation.

    The std is the unbiased (Bessel-corrected) sample std over the group's valid episodes. NaN
    scores and groups of fewer than two valid episodes get 0, as in :func:`mean_advantages`.
    A group whose scores are all equal gets 0 (0 / eps).

    Args:
        scores: ``[B]`` float outcome per episode, NaN = no outcome.
        keys: ``[B]`` integer group keys.
        eps: added to the std so equal-score groups do not divide by zero.

    Returns:
        ``[B]`` advantages in group-std units, same dtype as ``scores``.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0 for mean_std advantages, got {eps}")
    clean, valid, count, mean = _group_stats(scores, keys)
    _, inv = torch.unique(keys, return_inverse=True)
    dev = torch.where(valid, clean - mean, torch.zeros_like(clean))
    sq = torch.zeros(int(inv.max().item()) + 1 if inv.numel() else 0,
                     dtype=scores.dtype, device=scores.device).index_add_(0, inv, dev * dev)
    var = sq[inv] / (count - 1).clamp(min=1)
    adv = dev / (var.sqrt() + eps)
    return torch.where(valid & (count > 1), adv, torch.zeros_like(adv))


def group_advantages(scores: Tensor, keys: Tensor, method: str = "mean",
                     eps: float = 1e-6) -> Tensor:
    """Advantages with the estimator registered as ``method`` in ``ADVANTAGES``.

    Args:
        scores: ``[B]`` float outcome per episode; NaN = no outcome (advantage 0).
        keys: ``[B]`` integer group keys from :func:`group_keys`.
        method: ``"mean"`` or ``"mean_std"`` (or any registered name; unknown names raise and
            list the known ones).
        eps: std offset for ``mean_std``.

    Returns:
        ``[B]`` advantage per episode; a group of size 1 gets 0.
    """
    return ADVANTAGES.get(method)(scores, keys, eps=eps)


def split_group_advantages(scores: Tensor, task_group: Tensor, with_experience: Tensor, *,
                           split: bool = True, method: str = "mean", eps: float = 1e-6) -> Tensor:
    """:func:`group_keys` then :func:`group_advantages`, in one call. Shapes all ``[B]``."""
    return group_advantages(scores, group_keys(task_group, with_experience, split), method, eps)


def broadcast_to_tokens(episode_adv: Tensor, episode_index: Tensor, token_mask: Tensor) -> Tensor:
    """Give every completion token of every turn its episode's advantage.

    Args:
        episode_adv: ``[B]`` advantage per episode.
        episode_index: ``[N]`` long, for each turn sample (one model call) the index of its
            episode in ``episode_adv``.
        token_mask: ``[N, T]`` bool or 0/1, True on completion tokens that are trained
            (prompt and padding positions False).

    Returns:
        ``[N, T]`` advantages, ``episode_adv[episode_index[n]]`` where the mask is set, 0 elsewhere;
        dtype of ``episode_adv``.
    """
    _check_1d("episode_adv", episode_adv)
    _check_1d("episode_index", episode_index)
    if token_mask.dim() != 2 or token_mask.shape[0] != episode_index.shape[0]:
        raise ValueError(f"token_mask must be [N, T] with N = len(episode_index) = "
                         f"{episode_index.shape[0]}, got shape {tuple(token_mask.shape)}")
    if episode_index.dtype.is_floating_point or episode_index.dtype == torch.bool:
        raise TypeError(f"episode_index must be integer, got dtype {episode_index.dtype}")
    if episode_index.numel() and (int(episode_index.min()) < 0
                                  or int(episode_index.max()) >= episode_adv.shape[0]):
        raise IndexError(f"episode_index must lie in [0, {episode_adv.shape[0]}) (one entry per "
                         f"episode of episode_adv); got range [{int(episode_index.min())}, "
                         f"{int(episode_index.max())}]")
    per_turn = episode_adv[episode_index.to(torch.long)].unsqueeze(1)
    return per_turn * token_mask.to(episode_adv.dtype)
