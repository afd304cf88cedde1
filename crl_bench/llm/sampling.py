"""Next-token sampling as a pure tensor function (temperature, top-k, top-p, greedy)."""

from __future__ import annotations

from typing import Any


def filter_logits(scaled_logits: Any, top_k: int = 0, top_p: float = 1.0) -> Any:
    """Set to -inf every logit outside the top-k and outside the top-p nucleus.

    Args:
        scaled_logits: [B, V] float, logits already divided by the temperature.
        top_k: keep the k largest logits per row (0 = keep all). Ties at the k-th value are kept.
        top_p: keep the smallest prefix of tokens (by decreasing probability) whose probability
            mass reaches ``top_p``; the most likely token is always kept.

    Returns:
        [B, V] float, a filtered copy.
    """
    import torch

    out = scaled_logits.clone()
    vocab = out.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs       # mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p               # the prefix already reached top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_next_tokens(logits: Any, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                       generator: Any = None) -> tuple[Any, Any]:
    """Draw one token per row and return it with its log-prob.

    Args:
        logits: [B, V] raw model logits (any float dtype; computed in fp32).
        temperature: > 0 samples from ``softmax(logits / temperature)`` restricted by top-k/top-p;
            0 is greedy (argmax).
        generator: optional ``torch.Generator`` on the logits' device.

    Returns:
        tokens [B] int64 and logprobs [B] float32 where
        ``logprobs = log_softmax(logits / t)[token]``, t = temperature (1 when greedy), i.e. the
        log-prob before top-k/top-p truncation, which a training forward pass reproduces.
    """
    import torch

    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logprobs = logits.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    scaled = logits / temperature if temperature != 1.0 else logits
    logprobs_all = scaled.log_softmax(dim=-1)
    if top_k > 0 or top_p < 1.0:
        probs = filter_logits(scaled, top_k, top_p).softmax(dim=-1)
    else:
        probs = logprobs_all.exp()
    # argmax(p / E) with E ~ Exp(1) is a draw from p (the exponential race); on CPU it is far
    # cheaper than torch.multinomial over a 50k-token vocabulary.
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    tokens = (probs / race).argmax(dim=-1)
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)
