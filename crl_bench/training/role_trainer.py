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
from typing import Any, Sequence

from crl_bench.llm.types import TrainSample
from crl_bench.config.schema import OptimConfig
from crl_bench.training.precision import MixedPrecision
from crl_bench.training.update import (collate_on_device, micro_batch_step, micro_batches,
                                       order_for_micro_batches, plan_step, recompute_old,
                                       select_samples, token_counts)

__all__ = ["RoleTrainer", "TrainSample", "checkpointing", "enable_checkpointing",
           "micro_batches", "order_for_micro_batches", "timed", "token_counts"]


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
    def step_lr(self) -> float:
        """The learning rate of the next optimiser step (warm-up and schedule at ``updates``)."""
        return self.cfg.lr * _schedule_factor(self.updates, self.cfg, self.total_steps)

    def scoring_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments of the backend's ``forward_token_logprobs`` for this role:
        ``chunk_tokens`` when ``logprob_chunk_tokens`` asks for chunked log-probs."""
        n = int(getattr(self.cfg, "logprob_chunk_tokens", 0) or 0)
        return {"chunk_tokens": n} if n > 0 else {}

    def update(self, samples: Sequence[TrainSample], *, loss: str, loss_kwargs: dict[str, Any],
               agg: str = "token-mean", temperature: float = 1.0) -> dict[str, float]:
        """One update on ``samples``: one optimiser step (official), or ``cfg.mini_batches``
        steps on disjoint shuffled mini-batches (PPO's minibatches); returns metrics (loss, grad
        norm, clip fraction...; means over the mini-batches). Each step is
        :func:`~crl_bench.training.update.micro_batch_step`.

        ``temperature`` must be the one the log-probs were recorded at
        (``SamplingParams.logprob_temperature``), so that the ratio is 1 for on-policy samples.
        """
        samples = select_samples(samples, self.cfg, self._rng)
        n_parts = min(self.cfg.mini_batches, len(samples))
        if n_parts <= 1:
            parts = [samples]
        else:  # disjoint, near-equal, shuffled (samples of one episode spread over the steps)
            order = list(samples)
            self._rng.shuffle(order)
            parts = [order[i::n_parts] for i in range(n_parts)]
        lr = self.step_lr()
        by_prompt = getattr(self.backend, "share_prompt_prefix", False)
        with self.lock:
            plans = [plan_step(part, self.cfg, by_prompt=by_prompt) for part in parts]
            collated = [collate_on_device(self, p.chunks) for p in plans]
            # "old" log-probs are recomputed for every mini-batch before the first step: they are
            # the policy that played the batch, not the one after the earlier mini-batches
            recomputed = [recompute_old(self, c, temperature) if self.cfg.recompute_old_logprobs
                          else ([], 0.0) for c in collated]
            results = []
            for plan, c, old in zip(plans, collated, recomputed):
                metrics = {"samples": float(len(plan.samples)),
                           "active_samples": float(len(plan.active))}
                if not plan.active:  # nothing carries a gradient (all advantages or weights 0)
                    metrics.update(loss=0.0, grad_norm=0.0, skipped=1.0)
                else:
                    metrics.update(micro_batch_step(
                        self, plan.chunks, plan.totals, loss=loss, loss_kwargs=loss_kwargs,
                        agg=agg, temperature=temperature, lr=lr, collated=c, old=old))
                    metrics.update(tokens=plan.totals["tokens"], skipped=0.0)
                results.append(metrics)
            if any(not r.get("skipped") for r in results):
                self.updates += 1
                self.backend.after_update(self.adapter)
        if len(results) == 1:
            return results[0]
        stepped = [r for r in results if not r.get("skipped")]
        metrics = {"samples": float(len(samples)),
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
