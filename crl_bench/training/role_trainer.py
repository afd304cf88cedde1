"""Policy-gradient updates of one role (actor or extractor) from recorded samples.

One sample per model call (a turn of the actor, an extraction of the extractor): the exact
prompt ids, the sampled completion ids and their sampling log-probs, an advantage and a weight.
The loss is computed on completion tokens only. Samples are processed in micro-batches with
gradient accumulation, so memory stays bounded by ``micro_batch_size`` whatever the batch size;
each micro-batch's loss is scaled by its share of the batch's tokens (or sequences), so the
accumulated gradient equals the gradient of the loss aggregated over the whole batch. Samples
with advantage 0 or weight 0 are not run through the model (their terms are 0) but still count
in that denominator, as in the official loss.

Old log-probs are the *sampling* log-probs recorded at generation time (so a sampler/trainer
mismatch, or a sample re-used after earlier updates, shows up in the importance ratio), or, with
``recompute_old_logprobs`` (the official way), this trainer's own log-probs computed just before
the update on the same micro-batches (the ratio is then exactly 1 at the first micro-step).

A sample may be a whole multi-turn episode (:class:`TrainSample` with a ``completion_mask``):
the shared prefix is encoded once and the loss is taken on every assistant turn. There is
no KL term and no entropy bonus (the official configuration has neither).

Mixed precision: when the trainable parameters are 16-bit (a bf16 model with full
fine-tuning), forward and backward run in bf16 while gradients accumulate, clipping and AdamW run
on fp32 master weights, cast back into the module after every step so that generation sees the
update (:mod:`crl_bench.training.precision`; 18 bytes per parameter). fp32 parameters (fp32
models, and LoRA adapters, which PEFT keeps in fp32 on a bf16 base) are stepped directly.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from typing import Any, Sequence

from crl_bench.llm.types import TrainSample
from crl_bench.config.schema import OptimConfig
from crl_bench.training.precision import MixedPrecision


def _schedule_factor(step: int, cfg: OptimConfig, total_steps: int) -> float:
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "cosine":
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


class RoleTrainer:
    """AdamW + LR schedule + micro-batched policy-gradient updates for one adapter.

    Args:
        backend: the generation/training backend (``crl_bench.llm``): needs
            ``trainable_parameters(adapter)``, ``forward_token_logprobs(adapter, ids, mask)`` and
            ``after_update(adapter)``.
        adapter: the role's adapter name ("actor" or "extractor").
        cfg: optimiser settings; ``loss``/``agg`` and clip values are read from it when present.
        total_steps: planned number of updates (for the cosine schedule).
        lock: held around every forward/backward/optimiser step (the backend is shared with
            generation in other threads).
    """

    def __init__(self, backend: Any, adapter: str, cfg: OptimConfig, *, total_steps: int,
                 lock: threading.RLock | None = None, seed: int = 0) -> None:
        import torch

        self.backend = backend
        self.adapter = adapter
        self.cfg = cfg
        self.total_steps = total_steps
        self.lock = lock or threading.RLock()
        self.params = [p for p in backend.trainable_parameters(adapter) if p.requires_grad]
        if not self.params:
            raise RuntimeError(f"adapter {adapter!r} has no trainable parameters")
        self.precision = MixedPrecision(self.params)
        self.optimizer = torch.optim.AdamW(self.precision.optimized, lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.updates = 0
        self._rng = random.Random(seed)

    # -- state for checkpoints -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict(), "updates": self.updates,
                 "rng": self._rng.getstate()}
        if self.precision.masters:  # the bf16 weights saved with the model are a rounding
            state["masters"] = [m.detach().clone() for m in self.precision.masters]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self._rng.setstate(state["rng"])
        if self.precision.masters:
            # without saved masters (an older checkpoint), the module's loaded weights are them
            self.precision.load_masters(state.get("masters"))

    def weights(self) -> list[Any]:
        """CPU copies of the trained weights at full precision (the fp32 masters when there are)."""
        return [p.detach().to("cpu").clone() for p in self.precision.optimized]

    def load_weights(self, weights: Sequence[Any]) -> None:
        """Set the trained weights (masters and module) from :meth:`weights` of a like trainer."""
        self.precision.load(weights)

    # -- one optimiser step, shared with the distributed learner -------------------------------
    def begin_step(self) -> contextlib.AbstractContextManager:
        """Zero the gradients; inside the context, backward passes accumulate the gradient
        (into fp32 master gradients under mixed precision)."""
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None
        stack = contextlib.ExitStack()
        stack.enter_context(self.precision.accumulating())
        if getattr(self.cfg, "activation_checkpointing", False):
            stack.enter_context(checkpointing(self.backend.trainable_model(self.adapter)))
            if getattr(self.backend, "share_prompt_prefix", False):
                # a shared prompt prefix is passed as KV cache, which transformers drops inside
                # checkpointed layers: every row encodes its whole sequence instead
                stack.enter_context(_attribute(self.backend, "share_prompt_prefix", False))
        return stack

    def finish_step(self, lr: float) -> Any:
        """Clip the accumulated gradient, one AdamW step at ``lr``, the module's weights
        refreshed from the masters; returns the gradient norm before clipping."""
        import torch

        grad_norm = torch.nn.utils.clip_grad_norm_(self.precision.optimized, self.cfg.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.write_back()
        return grad_norm

    def gradients(self) -> list[Any]:
        """The accumulated gradient of each trained weight (zeros where none arrived)."""
        import torch

        return [p.grad if p.grad is not None else torch.zeros_like(p)
                for p in self.precision.optimized]

    # -- the update ----------------------------------------------------------------------------
    def _loss_fn(self, loss_name: str) -> Any:
        from crl_bench.algorithms import LOSSES

        return LOSSES.get(loss_name)

    def update(self, samples: Sequence[TrainSample], *, loss: str, loss_kwargs: dict[str, Any],
               agg: str = "token-mean", temperature: float = 1.0) -> dict[str, float]:
        """One update on ``samples``: one optimiser step (official), or ``cfg.mini_batches``
        steps on disjoint shuffled mini-batches (PPO's minibatches); returns metrics (loss, grad
        norm, clip fraction...; means over the mini-batches).

        ``temperature`` must be the one the log-probs were recorded at
        (``SamplingParams.logprob_temperature``), so that the ratio is 1 for on-policy samples.
        """
        samples = [s for s in samples if s.n_tokens > 0]
        if self.cfg.max_samples_per_update and len(samples) > self.cfg.max_samples_per_update:
            samples = self._rng.sample(samples, self.cfg.max_samples_per_update)
        n_parts = min(self.cfg.mini_batches, len(samples))
        if n_parts <= 1:
            parts = [samples]
        else:  # disjoint, near-equal, shuffled (samples of one episode spread over the steps)
            order = list(samples)
            self._rng.shuffle(order)
            parts = [order[i::n_parts] for i in range(n_parts)]
        factor = _schedule_factor(self.updates, self.cfg, self.total_steps)
        with self.lock:
            prepared = [self._prepare(part) for part in parts]
            # "old" log-probs are recomputed for every mini-batch before the first step: they are
            # the policy that played the batch, not the one after the earlier mini-batches
            recomputed = [self._recompute(p, temperature) if self.cfg.recompute_old_logprobs
                          else ([], 0.0) for p in prepared]
            results = [self._step(p, r, loss=loss, loss_kwargs=loss_kwargs, agg=agg,
                                  temperature=temperature, lr=self.cfg.lr * factor)
                       for p, r in zip(prepared, recomputed)]
            if any(not r.get("skipped") for r in results):
                self.updates += 1
                self.backend.after_update(self.adapter)
        if len(results) == 1:
            return results[0]
        stepped = [r for r in results if not r.get("skipped")]
        metrics: dict[str, float] = {
            "samples": float(len(samples)),
            "active_samples": sum(r["active_samples"] for r in results),
            "optimizer_steps": float(len(stepped)), "skipped": 0.0 if stepped else 1.0}
        for key in ("tokens", "model_tokens", "encoded_tokens", "time_recompute_s",
                    "time_forward_s", "time_backward_s"):
            if key != "encoded_tokens" or any(key in r for r in results):
                metrics[key] = sum(r.get(key, 0.0) for r in results)
        for key in sorted({k for r in stepped for k in r} - set(metrics)):
            metrics[key] = sum(r[key] for r in stepped if key in r) / len(stepped)
        if not stepped:
            metrics.update(loss=0.0, grad_norm=0.0)
        return metrics

    def _prepare(self, samples: list[TrainSample]) -> dict[str, Any]:
        active = [s for s in samples if s.weight != 0.0 and s.advantage != 0.0]
        chunks = micro_batches(order_for_micro_batches(
            active, by_prompt=getattr(self.backend, "share_prompt_prefix", False)),
            self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)
        # the masks and advantages meet the model's log-probs: on the model's device (CUDA)
        device = getattr(self.backend, "device", None)
        collated = [self._collate(chunk) for chunk in chunks]
        if device is not None and str(device) != "cpu":
            collated = [tuple(t.to(device) for t in c) for c in collated]
        return {"samples": samples, "active": active, "chunks": chunks, "collated": collated}

    def scoring_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments of the backend's ``forward_token_logprobs`` for this role:
        ``chunk_tokens`` when ``logprob_chunk_tokens`` asks for chunked log-probs."""
        n = int(getattr(self.cfg, "logprob_chunk_tokens", 0) or 0)
        return {"chunk_tokens": n} if n > 0 else {}

    def _recompute(self, prepared: dict[str, Any], temperature: float) -> tuple[list[Any], float]:
        """This trainer's log-probs of the mini-batch before the update (official: the ratio is
        exactly 1 at the first micro-step), on the very micro-batches the update runs, so that
        padding and batch shapes are the same too."""
        import torch

        t_start = time.perf_counter()
        out: list[Any] = []
        with torch.no_grad():
            for ids, attn, _, _, cmask in prepared["collated"]:
                lp = self.backend.forward_token_logprobs(self.adapter, ids, attn,
                                                         temperature=temperature,
                                                         score_mask=cmask[:, 1:] > 0,
                                                         **self.scoring_kwargs())
                out.append(lp.float().detach() * cmask[:, 1:])
        return out, time.perf_counter() - t_start

    def _step(self, prepared: dict[str, Any], recomputed: tuple[list[Any], float], *, loss: str,
              loss_kwargs: dict[str, Any], agg: str, temperature: float, lr: float
              ) -> dict[str, float]:
        """One optimiser step on one (mini-)batch."""
        import torch

        samples, active, chunks = prepared["samples"], prepared["active"], prepared["chunks"]
        metrics: dict[str, float] = {"samples": float(len(samples)), "active_samples": float(len(active))}
        if not active:  # nothing carries a gradient (all advantages or weights are zero)
            metrics.update(loss=0.0, grad_norm=0.0, skipped=1.0)
            return metrics
        loss_fn = self._loss_fn(loss)
        # The loss is aggregated over *every* sample, as the official loss is (ROLL's agg_loss
        # over the whole batch, the count-aware weight folded into the advantage): a sample with
        # advantage 0 or weight 0 adds no gradient but still counts in the token / sequence
        # denominator. Only the active samples are run through the model (the others' terms
        # are exactly 0), each micro-batch scaled by its share of the *whole* batch: its trained
        # tokens / all trained tokens (token-mean), its sequences / all sequences (seq-mean-*,
        # whose in-chunk loss is already a mean over the chunk's sequences).
        total_tokens = sum(s.n_tokens for s in samples)
        total_seqs = len(samples)
        active_tokens = sum(s.n_tokens for s in active)
        sums: dict[str, float] = {}
        total_loss = 0.0
        old_lps, recompute_s = recomputed
        clock = {"time_recompute_s": recompute_s, "time_forward_s": 0.0, "time_backward_s": 0.0}
        stats = getattr(self.backend, "train_stats", None)
        encoded_before = stats["model_tokens"] if stats else 0
        with self.begin_step():
            for ci, chunk in enumerate(chunks):
                ids, attn, lp_old, adv, cmask = prepared["collated"][ci]
                t_fwd = time.perf_counter()
                # only the completion positions go through the vocabulary projection
                logprobs = self.backend.forward_token_logprobs(self.adapter, ids, attn,
                                                               temperature=temperature,
                                                               score_mask=cmask[:, 1:] > 0,
                                                               **self.scoring_kwargs())
                logprobs = logprobs.float()
                # align: token t (t >= 1) is predicted at position t-1 of the log-prob tensor
                lp = logprobs * cmask[:, 1:]
                old = old_lps[ci] if old_lps else lp_old[:, 1:]
                out, m = loss_fn(lp, old, adv[:, 1:], cmask[:, 1:], agg=agg, **loss_kwargs)
                chunk_tokens = sum(s.n_tokens for s in chunk)
                share = (chunk_tokens / total_tokens if agg == "token-mean"
                         else len(chunk) / total_seqs)
                t_bwd = time.perf_counter()
                clock["time_forward_s"] += t_bwd - t_fwd
                (out * share).backward()
                clock["time_backward_s"] += time.perf_counter() - t_bwd
                total_loss += float(out.detach()) * share
                # diagnostics (clip fractions, ratios) are means over the active tokens
                m_share = chunk_tokens / active_tokens
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + float(v) * m_share
        grad_norm = self.finish_step(lr)
        metrics.update(sums)
        metrics.update(clock)
        metrics.update(token_counts(active, stats, encoded_before))
        metrics.update(loss=total_loss, grad_norm=float(grad_norm), lr=lr,
                       tokens=float(total_tokens), skipped=0.0)
        return metrics

    @staticmethod
    def _collate(chunk: Sequence[TrainSample]) -> tuple[Any, Any, Any, Any, Any]:
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


def token_counts(active: Sequence[TrainSample], stats: dict[str, int] | None,
                 encoded_before: int) -> dict[str, float]:
    """``model_tokens``: the tokens of the samples run through the model; ``encoded_tokens``
    (when the backend counts, in ``stats = backend.train_stats``, read before the update as
    ``encoded_before``): what it actually encoded, shared prompt prefixes once per micro-batch."""
    counts = {"model_tokens": float(sum(s.length for s in active))}
    if stats:
        counts["encoded_tokens"] = float(stats["model_tokens"] - encoded_before)
    return counts


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


@contextlib.contextmanager
def _attribute(obj: Any, name: str, value: Any):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def enable_checkpointing(model: Any) -> None:
    """Turn on transformers' (non-reentrant) gradient checkpointing of ``model``'s decoder
    layers; it acts in training mode only."""
    on = getattr(model, "is_activation_checkpointing", None)
    if on is None:
        on = getattr(model, "is_gradient_checkpointing", False)
    if not on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def checkpointing(model: Any):
    """Inside: ``model`` recomputes its decoder layers' activations in the backward (training
    mode: no dropout in the supported models, so the forward is unchanged); its mode after."""
    enable_checkpointing(model)
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def timed(metrics: dict[str, float], key: str):
    """Add the wall time of the block, in seconds, to ``metrics[key]``."""
    import time

    start = time.perf_counter()
    try:
        yield
    finally:
        metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - start
