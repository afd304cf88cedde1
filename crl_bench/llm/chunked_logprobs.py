"""Log-probs of the scored tokens over chunks of the sequence, without the whole vocabulary
logits of a micro-batch at once.

A training forward needs, per scored token, ``log softmax(h W^T / T)[target]``. Computed at once
for N scored tokens that is an [N, vocab] float32 tensor (plus the softmax its backward keeps):
16 B x vocab per token at the peak, 2.4 MB per token for a 152k vocabulary, 80 GB for 32k tokens.
:func:`chunked_head` replaces the model's output layer, for one forward, by a module that takes
the final hidden states of the scored positions ([N, hidden], the model's ``logits_to_keep``
mask) and returns their log-probs, ``chunk_tokens`` at a time; each chunk runs under
non-reentrant activation checkpointing, so its logits are freed after the forward and recomputed
in the backward. Peak: one chunk's logits. Values and gradients are those of the unchunked
computation (the same operations on row subsets; tested to fp32 tolerance).

The swap happens inside the model's own forward (the output layer is called where the model
calls it), so wrappers that hook the root module's forward (FSDP2's gathers, PEFT) see an
ordinary forward.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


def token_logprobs(head: Any, hidden: Any, targets: Any, *, temperature: float = 1.0,
                   chunk_tokens: int = 0, entropy: bool = False) -> Any:
    """``[N, 1]`` (``[N, 2]`` with ``entropy``: log-prob, entropy) of ``targets`` [N] under the
    logits ``head(hidden) / temperature``, ``hidden`` [N, H]; ``chunk_tokens`` rows at a time
    with each chunk's logits recomputed in the backward (0: all rows at once, kept)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    n = hidden.shape[0]
    step = chunk_tokens if chunk_tokens > 0 else max(n, 1)
    grad = torch.is_grad_enabled() and (hidden.requires_grad
                                        or any(p.requires_grad for p in head.parameters()))
    parts = []
    for start in range(0, max(n, 1), step):
        h, t = hidden[start:start + step], targets[start:start + step]
        if grad and chunk_tokens > 0:
            parts.append(checkpoint(_piece, head, h, t, temperature, entropy, use_reentrant=False))
        else:
            parts.append(_piece(head, h, t, temperature, entropy))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _piece(head: Any, hidden: Any, targets: Any, temperature: float, entropy: bool) -> Any:
    import torch

    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets[..., None]).squeeze(-1) - normaliser
    if not entropy:
        return picked[:, None]
    ent = normaliser - (logits.softmax(dim=-1) * logits).sum(dim=-1)
    return torch.stack([picked, ent], dim=-1)


def _head_owner(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _chunked_head_module(head: Any, targets: Any, temperature: float, chunk_tokens: int,
                         entropy: bool) -> Any:
    import torch

    class ChunkedHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = head

        def forward(self, hidden: Any) -> Any:
            if hidden.dim() == 3:  # a forward whose logits go unused (a shared prompt prefix)
                return self.head(hidden)
            if hidden.shape[0] != targets.shape[0]:
                raise ValueError(f"the chunked output layer needs the scored positions' hidden "
                                 f"states [{targets.shape[0]}, H] (a boolean logits_to_keep), "
                                 f"got {tuple(hidden.shape)}")
            return token_logprobs(self.head, hidden, targets, temperature=temperature,
                                  chunk_tokens=chunk_tokens, entropy=entropy)

    return ChunkedHead()


@contextlib.contextmanager
def chunked_head(model: Any, targets: Any, *, temperature: float, chunk_tokens: int,
                 entropy: bool = False) -> Iterator[None]:
    """While open, ``model``'s output layer returns the log-probs of ``targets`` (the scored
    positions' next tokens, in the order of the boolean ``logits_to_keep`` mask) instead of
    logits: ``out.logits`` is [N, 1], or [N, 2] with ``entropy``."""
    owner = _head_owner(model)
    head = owner.get_output_embeddings()
    owner.set_output_embeddings(_chunked_head_module(head, targets, temperature, chunk_tokens,
                                                     entropy))
    try:
        yield
    finally:
        owner.set_output_embeddings(head)
