"""The one micro-batch update loop, used by every form of a role's trainer.

An optimiser step on a batch of :class:`~crl_bench.llm.types.TrainSample` is planned once
(:func:`select_samples`: the samples with trained tokens and the ``max_samples_per_update``
draw; :func:`plan_step`: the active samples, ordered and cut into micro-batches, and the
whole batch's totals), then run by :func:`micro_batch_step`: forward, loss and backward of each
micro-batch, each loss scaled by its share of the *whole* batch's tokens (or sequences), the
gradient accumulated, one clip and AdamW step. The forms differ only in who runs which
micro-batches and how the gradient and the metric sums are combined:

* :class:`~crl_bench.training.role_trainer.RoleTrainer` (one process, the local host's
  trainer) runs every micro-batch of the step;
* the data-parallel learner's ranks (:mod:`crl_bench.distributed.learner`) each run their
  share and pass a ``reduce`` that sums the gradient and the metric sums over the ranks;
* the sharded learner's ranks (:mod:`crl_bench.distributed.fsdp`) the same, padded to a common
  number of micro-batches (FSDP sums the gradient in the backward).

A loss that needs another per-token tensor (reference log-probs for a KL term) adds it in
:func:`collate` and hands it to the loss in :func:`micro_batch_step`: one place for every form
(``docs/architecture.md``, "Adding a KL term").
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from crl_bench.llm.types import TrainSample


# -- planning one step ---------------------------------------------------------------------------
def select_samples(samples: Sequence[TrainSample], cfg: Any, rng: random.Random
                   ) -> list[TrainSample]:
    """The samples with trained tokens; at most ``cfg.max_samples_per_update`` of them (a draw
    from ``rng``)."""
    samples = [s for s in samples if s.n_tokens > 0]
    if cfg.max_samples_per_update and len(samples) > cfg.max_samples_per_update:
        samples = rng.sample(samples, cfg.max_samples_per_update)
    return samples


@dataclass
class StepPlan:
    """One optimiser step: ``samples`` (all of them count in the loss's denominator),
    ``active`` (non-zero advantage and weight: run through the model), ``chunks`` (the active
    samples cut into micro-batches)."""

    samples: list[TrainSample]
    active: list[TrainSample]
    chunks: list[list[TrainSample]]

    @property
    def totals(self) -> dict[str, float]:
        """The whole batch's trained tokens, sequences and active trained tokens (each
        micro-batch's share of the loss and of the diagnostics divides by them)."""
        return {"tokens": float(sum(s.n_tokens for s in self.samples)),
                "seqs": float(len(self.samples)),
                "active_tokens": float(sum(s.n_tokens for s in self.active))}


def plan_step(samples: Sequence[TrainSample], cfg: Any, *, by_prompt: bool) -> StepPlan:
    """The active samples of ``samples``, ordered (:func:`order_for_micro_batches`) and cut
    (:func:`micro_batches`, ``cfg.micro_batch_size`` / ``cfg.micro_batch_tokens``)."""
    samples = list(samples)
    active = [s for s in samples if s.weight != 0.0 and s.advantage != 0.0]
    chunks = micro_batches(order_for_micro_batches(active, by_prompt=by_prompt),
                           cfg.micro_batch_size, cfg.micro_batch_tokens)
    return StepPlan(samples, active, chunks)


def order_for_micro_batches(samples: Sequence[TrainSample], *, by_prompt: bool
                            ) -> list[TrainSample]:
    """The order :func:`micro_batches` cuts. ``by_prompt``: sorted by prompt tokens, so a GRPO
    group's samples sit in one micro-batch and a backend that shares prompt prefixes
    (``HFBackend(share_prompt_prefix=True)``) encodes the group's prompt once; otherwise longest
    first (similar lengths together, less padding)."""
    if by_prompt:
        return sorted(samples, key=lambda s: tuple(s.prompt_ids))
    return sorted(samples, key=lambda s: s.length, reverse=True)


def micro_batches(samples: Sequence[TrainSample], size: int, max_tokens: int = 0
                  ) -> list[list[TrainSample]]:
    """Consecutive chunks of ``samples`` (sorted longest first by the caller) with at most
    ``size`` samples and, when ``max_tokens > 0``, at most ``max_tokens`` padded tokens
    (chunk length x its longest sequence); a sample longer than ``max_tokens`` goes alone."""
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    chunks: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    longest = 0
    for s in samples:
        n = len(s.prompt_ids) + len(s.completion_ids)
        grown = max(longest, n)
        if current and (len(current) >= size or (max_tokens > 0 and grown * (len(current) + 1) > max_tokens)):
            chunks.append(current)
            current, grown = [], n
        current.append(s)
        longest = grown
    if current:
        chunks.append(current)
    return chunks


def idle_sample() -> TrainSample:
    """A two-token sample with advantage 0 (no gradient): a rank's padding micro-batch."""
    return TrainSample([0], [0], [0.0], 0.0)


# -- tensors -------------------------------------------------------------------------------------
def collate(chunk: Sequence[TrainSample]) -> tuple[Any, Any, Any, Any, Any]:
    """Right-padded [B, T] tensors: ids, attention mask, old log-probs, advantages, completion mask."""
    import torch

    length = max(len(s.prompt_ids) + len(s.completion_ids) for s in chunk)
    b = len(chunk)
    ids = torch.zeros((b, length), dtype=torch.long)
    attn = torch.zeros((b, length), dtype=torch.long)
    lp_old = torch.zeros((b, length), dtype=torch.float32)
    adv = torch.zeros((b, length), dtype=torch.float32)
    cmask = torch.zeros((b, length), dtype=torch.float32)
    for i, s in enumerate(chunk):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        if len(s.old_logprobs) != s.n_tokens:
            raise ValueError(f"sample {i}: {len(s.old_logprobs)} log-probs for {s.n_tokens} "
                             "trained completion tokens")
        ids[i, :p + c] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids), dtype=torch.long)
        attn[i, :p + c] = 1
        if s.completion_mask is None:
            lp_old[i, p:p + c] = torch.tensor(s.old_logprobs, dtype=torch.float32)
            cmask[i, p:p + c] = 1.0
        else:
            if len(s.completion_mask) != c:
                raise ValueError(f"sample {i}: completion_mask has {len(s.completion_mask)} "
                                 f"entries for {c} completion tokens")
            row = torch.tensor([1.0 if m else 0.0 for m in s.completion_mask])
            cmask[i, p:p + c] = row
            where = torch.nonzero(row, as_tuple=True)[0] + p
            lp_old[i, where] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        adv[i, p:p + c] = s.advantage * s.weight
    return ids, attn, lp_old, adv, cmask


def collate_on_device(trainer: Any, runs: Sequence[Sequence[TrainSample]]) -> list[tuple]:
    """:func:`collate` of each micro-batch, on the model's device (the masks and advantages
    meet the model's log-probs there)."""
    collated = [collate(chunk) for chunk in runs]
    device = getattr(trainer.backend, "device", None)
    if device is not None and str(device) != "cpu":
        collated = [tuple(t.to(device) for t in c) for c in collated]
    return collated


def token_logprobs(trainer: Any, ids: Any, attn: Any, cmask: Any, temperature: float) -> Any:
    """The trainer's role's log-probs of the completion tokens (fp32; position t-1 holds token
    t's); only the completion positions go through the vocabulary projection."""
    return trainer.backend.forward_token_logprobs(trainer.adapter, ids, attn,
                                                  temperature=temperature,
                                                  score_mask=cmask[:, 1:] > 0,
                                                  **trainer.scoring_kwargs()).float()


def recompute_old(trainer: Any, collated: Sequence[tuple], temperature: float
                  ) -> tuple[list[Any], float]:
    """``recompute_old_logprobs`` (official): the trainer's log-probs of each micro-batch
    before the update, on the very micro-batches the update runs (same padding, same shapes;
    the ratio is exactly 1 at the first micro-step); and the seconds it took."""
    import torch

    t_start = time.perf_counter()
    out: list[Any] = []
    with torch.no_grad():
        for ids, attn, _, _, cmask in collated:
            out.append(token_logprobs(trainer, ids, attn, cmask, temperature).detach()
                       * cmask[:, 1:])
    return out, time.perf_counter() - t_start


def token_counts(active: Sequence[TrainSample], stats: dict[str, int] | None,
                 encoded_before: int) -> dict[str, float]:
    """``model_tokens``: the tokens of the samples run through the model; ``encoded_tokens``
    (when the backend counts, in ``stats = backend.train_stats``, read before the update as
    ``encoded_before``): what it actually encoded, shared prompt prefixes once per micro-batch."""
    counts = {"model_tokens": float(sum(s.length for s in active))}
    if stats:
        counts["encoded_tokens"] = float(stats["model_tokens"] - encoded_before)
    return counts


# -- the loop ------------------------------------------------------------------------------------
def micro_batch_step(trainer: Any, chunks: Sequence[Sequence[TrainSample]],
                     totals: dict[str, float], *, loss: str, loss_kwargs: dict[str, Any],
                     agg: str, temperature: float, lr: float,
                     collated: Sequence[tuple] | None = None,
                     old: tuple[list[Any], float] | None = None, pad_to: int = 0,
                     reduce: Callable[[float, dict[str, float]], dict[str, float]] | None = None
                     ) -> dict[str, float]:
    """One optimiser step of ``trainer`` (a :class:`~crl_bench.training.role_trainer.
    RoleTrainer`: its backend, role, optimiser and precision) on its micro-batches ``chunks``.

    Each micro-batch's loss is scaled by its share of the whole batch (``totals``, see
    :attr:`StepPlan.totals`): its trained tokens / all trained tokens (``token-mean``), its
    sequences / all sequences (``seq-mean-*``, whose in-chunk loss is already a mean over the
    chunk's sequences), so the accumulated gradient is that of the loss aggregated over the
    whole batch (samples with advantage or weight 0 add no gradient but count in the
    denominator, as in the official loss). Diagnostics (clip fractions, ratios) are means over
    the active tokens.

    ``collated`` / ``old``: the micro-batches' tensors and the recomputed old log-probs with
    their seconds, when the caller made them already (one process recomputes every mini-batch
    before the first step); ``pad_to``: run zero-gradient micro-batches until this many ran
    (sharded ranks must run the same number of forwards and backwards); ``reduce(loss, sums)``:
    combine the metric sums and the loss (and the gradient) over ranks before the optimiser
    step; returns the metrics ``loss`` included.

    Returns the metrics: the diagnostics, ``time_*_s`` (without ``reduce``: one process's
    seconds), token counts, ``loss``, ``grad_norm``, ``lr``.
    """
    from crl_bench.algorithms import LOSSES

    loss_fn = LOSSES.get(loss)
    runs = list(chunks) + [[idle_sample()]] * max(0, pad_to - len(chunks))
    if collated is None:
        collated = collate_on_device(trainer, runs)
    if old is None:
        old = (recompute_old(trainer, collated, temperature)
               if getattr(trainer.cfg, "recompute_old_logprobs", False) else ([], 0.0))
    old_lps, recompute_s = old
    sums: dict[str, float] = {}
    total_loss = 0.0
    clock = {"time_recompute_s": recompute_s, "time_forward_s": 0.0, "time_backward_s": 0.0}
    stats = getattr(trainer.backend, "train_stats", None)
    encoded_before = stats["model_tokens"] if stats else 0
    with trainer.begin_step():
        for ci, chunk in enumerate(runs):
            ids, attn, lp_old, adv, cmask = collated[ci]
            t_fwd = time.perf_counter()
            # align: token t (t >= 1) is predicted at position t-1 of the log-prob tensor
            lp = token_logprobs(trainer, ids, attn, cmask, temperature) * cmask[:, 1:]
            prev = old_lps[ci] if old_lps else lp_old[:, 1:]
            out, m = loss_fn(lp, prev, adv[:, 1:], cmask[:, 1:], agg=agg, **loss_kwargs)
            t_bwd = time.perf_counter()
            clock["time_forward_s"] += t_bwd - t_fwd
            if ci >= len(chunks):  # padding: a backward through the graph, a zero gradient
                (out * 0.0).backward()
                continue
            chunk_tokens = sum(s.n_tokens for s in chunk)
            share = (chunk_tokens / totals["tokens"] if agg == "token-mean"
                     else len(chunk) / totals["seqs"])
            (out * share).backward()
            clock["time_backward_s"] += time.perf_counter() - t_bwd
            total_loss += float(out.detach()) * share
            m_share = chunk_tokens / totals["active_tokens"]
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v) * m_share
    counts = token_counts([s for chunk in chunks for s in chunk], stats, encoded_before)
    if reduce is not None:  # one rank's seconds are not the step's: times are local only
        metrics = reduce(total_loss, {**sums, **counts})
    else:
        metrics = {**sums, **clock, **counts, "loss": total_loss}
    grad_norm = trainer.finish_step(lr)
    if hasattr(grad_norm, "full_tensor"):  # a sharded gradient's norm (FSDP2)
        grad_norm = grad_norm.full_tensor()
    metrics.update(grad_norm=float(grad_norm), lr=lr)
    return metrics
