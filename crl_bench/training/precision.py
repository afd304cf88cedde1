"""fp32 master weights for a module whose trainable parameters are bf16 (or fp16).

An optimiser stepping bf16 weights directly loses small updates: an AdamW step at lr 1e-6 is far
below half a bf16 ulp of a typical weight (~1e-2 in magnitude: ulp 6e-5) and rounds away
(measured on CPU: 1.95% of a 1024x1024 bf16 weight's entries move in one step, 100% in fp32).
The official stack (Megatron) keeps fp32 main parameters; so does this.

:class:`MixedPrecision` pairs each 16-bit parameter with an fp32 master:

* the optimiser is built on :attr:`MixedPrecision.optimized` (the masters, and the fp32
  parameters themselves, which need none);
* inside :meth:`MixedPrecision.accumulating` every backward adds each 16-bit gradient into its
  master's fp32 gradient the moment the gradient is complete (a post-accumulate-grad hook) and
  frees it, so micro-batches accumulate in fp32 and at most one bf16 gradient is alive at a time
  per parameter being reduced;
* :meth:`MixedPrecision.write_back` casts the masters into the module's weights after the step
  (round to nearest), so whatever reads the module (generation) sees the update.

Bytes per 16-bit trainable parameter: 2 (weight) + 4 (master) + 4 (fp32 gradient) + 8 (AdamW's
two fp32 moments) = 18. The bf16 weight is not a duplicate to drop: it is what generation and
the bf16 forward read.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence


def is_low_precision(t: Any) -> bool:
    """A floating-point tensor of fewer than 32 bits (bf16, fp16)."""
    return bool(t.is_floating_point() and t.element_size() < 4)


class MixedPrecision:
    """fp32 masters for the 16-bit tensors of ``params`` (none when all are fp32).

    Attributes:
        params: the module's trainable parameters, in order.
        optimized: what the optimiser steps, aligned with ``params``: the fp32 master of a
            16-bit parameter, the parameter itself otherwise.
        masters: the fp32 masters only (empty: nothing to do, the trainer behaves as plain fp32).
    """

    def __init__(self, params: Sequence[Any]) -> None:
        import torch

        self.params = list(params)
        self.optimized: list[Any] = []
        self._pairs: list[tuple[Any, Any]] = []
        for p in self.params:
            if is_low_precision(p):
                master = torch.nn.Parameter(p.detach().to(torch.float32).clone())
                self._pairs.append((p, master))
                self.optimized.append(master)
            else:
                self.optimized.append(p)
        self.masters = [m for _, m in self._pairs]

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        """While open, backward passes add the 16-bit gradients into the masters' fp32 ones."""
        handles = [p.register_post_accumulate_grad_hook(
            lambda p, m=m: self._accumulate(p, m)) for p, m in self._pairs]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @staticmethod
    def _accumulate(p: Any, master: Any) -> None:
        import torch

        if master.grad is None:
            master.grad = p.grad.to(torch.float32)
        else:
            master.grad.add_(p.grad)
        p.grad = None

    def write_back(self) -> None:
        """The module's 16-bit weights := the masters, rounded to nearest."""
        import torch

        with torch.no_grad():
            for p, m in self._pairs:
                p.copy_(m)

    def load(self, weights: Sequence[Any]) -> None:
        """Set every trained weight (aligned with :attr:`params`) at full precision. A 16-bit
        tensor that is exactly its master rounded (the module's own weights, sent back) leaves
        the master as it is: reloading the module must not drop the masters' extra bits."""
        import torch

        if len(weights) == len(self.optimized):
            weights = [o if o is not p and is_low_precision(w)
                       and torch.equal(o.detach().to(w.dtype), w.to(o.device)) else w
                       for p, o, w in zip(self.params, self.optimized, weights)]
        self._set(self.optimized, weights, "trained weights")

    def load_masters(self, masters: Sequence[Any] | None) -> None:
        """Set the fp32 masters (as saved from :attr:`masters`) and the module from them;
        ``None``: from the module's current 16-bit weights (a checkpoint without masters)."""
        if masters is None:
            masters = [p for p, _ in self._pairs]
        self._set(self.masters, masters, "fp32 masters")

    def _set(self, targets: list[Any], values: Sequence[Any], what: str) -> None:
        copy_weights(targets, values, what)
        self.write_back()


def copy_weights(targets: Sequence[Any], values: Sequence[Any], what: str) -> None:
    """``targets[i] := values[i]`` in place, cast to each target's dtype and device."""
    import torch

    if len(values) != len(targets):
        raise ValueError(f"{len(values)} tensors for {len(targets)} {what}: they come from a "
                         "differently built model")
    with torch.no_grad():
        for t, v in zip(targets, values):
            t.copy_(v.to(device=t.device, dtype=t.dtype))


def role_weights(backend: Any, role: str) -> list[Any]:
    """CPU copies of the trainable parameters of ``role`` (LoRA A/B or all weights), in order."""
    return [p.detach().to("cpu").clone() for p in backend.trainable_parameters(role)]


def load_role_weights(backend: Any, role: str, weights: Sequence[Any]) -> None:
    """Copy ``weights`` (from :func:`role_weights` of a backend built the same way) into ``role``."""
    copy_weights(backend.trainable_parameters(role), weights, f"parameters of role {role!r}")
