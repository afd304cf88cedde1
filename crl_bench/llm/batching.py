"""Pack recorded (prompt, completion) token ids into padded training tensors.

Everything here keeps the sampler's ids: nothing is re-tokenised. Sequences are right-padded;
the backends compute position ids from the attention mask, so padding side does not change the
log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass
class TokenBatch:
    """Padded prompt+completion sequences.

    Shapes (B sequences, T = longest prompt+completion):

    * ``input_ids`` [B, T] int64, right-padded with ``pad_token_id``;
    * ``attention_mask`` [B, T] int64, 1 on real tokens;
    * ``loss_mask`` [B, T-1] float32, 1 where position t+1 is a completion token, i.e. aligned
      with ``forward_token_logprobs(...)[:, t] = log p(input_ids[:, t+1] | input_ids[:, :t+1])``;
    * ``old_logprobs`` [B, T-1] float32, the sampling log-probs at the same positions (0 elsewhere);
    * ``prompt_lengths`` / ``completion_lengths`` [B] int64.
    """

    input_ids: Any
    attention_mask: Any
    loss_mask: Any
    old_logprobs: Any
    prompt_lengths: Any
    completion_lengths: Any

    def to(self, device: Any) -> "TokenBatch":
        return TokenBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))

    def completion_values(self, per_position: Any) -> list[list[float]]:
        """Split a [B, T-1] tensor aligned like ``loss_mask`` into per-completion lists."""
        out = []
        for b in range(per_position.shape[0]):
            start = int(self.prompt_lengths[b]) - 1
            n = int(self.completion_lengths[b])
            out.append(per_position[b, start:start + n].tolist())
        return out


def collate_sequences(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                      pad_token_id: int, old_logprobs: Sequence[Sequence[float]] | None = None
                      ) -> TokenBatch:
    """Right-pad ``prompt + completion`` sequences into a :class:`TokenBatch`.

    Raises:
        ValueError: lengths disagree, a prompt is empty, or a completion is empty.
    """
    import torch

    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions.")
    if old_logprobs is not None and len(old_logprobs) != len(completion_ids):
        raise ValueError(f"{len(old_logprobs)} log-prob lists for {len(completion_ids)} completions.")
    if not prompt_ids:
        raise ValueError("collate_sequences needs at least one sequence.")
    lengths = []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: a completion's first token needs a prefix.")
        if len(c) == 0:
            raise ValueError(f"completion {i} is empty: there is nothing to score.")
        if old_logprobs is not None and len(old_logprobs[i]) != len(c):
            raise ValueError(f"completion {i} has {len(c)} tokens but {len(old_logprobs[i])} "
                             "log-probs.")
        lengths.append(len(p) + len(c))
    B, T = len(lengths), max(lengths)
    input_ids = torch.full((B, T), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T - 1), dtype=torch.float32)
    old = torch.zeros((B, T - 1), dtype=torch.float32)
    for b, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        n_p, n_c = len(p), len(c)
        input_ids[b, :n_p + n_c] = torch.tensor(list(p) + list(c), dtype=torch.long)
        attention_mask[b, :n_p + n_c] = 1
        loss_mask[b, n_p - 1:n_p - 1 + n_c] = 1.0
        if old_logprobs is not None:
            old[b, n_p - 1:n_p - 1 + n_c] = torch.tensor(list(old_logprobs[b]), dtype=torch.float32)
    return TokenBatch(input_ids, attention_mask, loss_mask, old,
                      torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
                      torch.tensor([len(c) for c in completion_ids], dtype=torch.long))


def position_ids_from_mask(attention_mask: Any) -> Any:
    """Positions that count only real tokens (left or right padding alike): [B, T] int64."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp_(min=0)
