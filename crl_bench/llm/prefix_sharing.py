"""Which prompt tokens a batch can encode once: pure functions over token ids.

A GRPO group's prompts are equal up to the episode's own part, and a batch often shares its
system prompt. :class:`crl_bench.llm.hf_backend.HFBackend` computes the KV of such a prefix once
and repeats it for the rows; these functions decide how long that prefix is. Each leaves every
row at least one token of its own (its logits come from there) and answers 0 / [] when the
saving is below the given threshold.
"""

from __future__ import annotations

from typing import Any


def shared_prefix_length(prompt_ids: list[list[int]], min_len: int) -> int:
    """Tokens all prompts start with (each row keeps >= 1 token of its own); 0 for one row or
    when shorter than ``min_len``."""
    if len(prompt_ids) < 2:
        return 0
    limit = min(len(p) for p in prompt_ids) - 1
    first = prompt_ids[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompt_ids):
        n += 1
    return n if n >= min_len else 0


def scored_prefix_length(input_ids: Any, attention_mask: Any, scored: Any, min_len: int) -> int:
    """Tokens every row of a padded training batch ([B, T] tensors) starts with, up to the first
    scored position of any row (the logits of position t come from token t, so scored positions
    stay in the rows' own part); 0 for one row, nothing scored, left padding, or fewer than
    ``min_len``."""
    if input_ids.shape[0] < 2 or not bool(scored.any()):
        return 0
    rows = scored.any(dim=1)
    first_scored = int(scored[rows].float().argmax(dim=1).min())
    real_lead = int(attention_mask.cumprod(dim=1).sum(dim=1).min())  # left padding -> 0
    same = (input_ids == input_ids[:1]).all(dim=0).long().cumprod(dim=0)
    n = min(int(same.sum()), first_scored, real_lead - 1)
    return n if n >= min_len else 0


def prefix_runs(prompt_ids: list[list[int]], min_len: int,
                min_saving: int) -> list[tuple[list[int], int]]:
    """Groups of rows (>= 2) sharing a prefix at least ``min_len`` longer than the batch-wide
    one, each with its prefix length (each row keeps >= 1 token of its own), when computing each
    group's prefix once prefills at least ``min_saving`` fewer tokens than sharing the
    batch-wide prefix only (rows outside every group then prefill in full); else []."""
    B = len(prompt_ids)
    if B < 3:
        return []
    order = sorted(range(B), key=lambda i: prompt_ids[i])

    def common(a: int, b: int) -> int:
        x, y = prompt_ids[a], prompt_ids[b]
        n, cap = 0, min(len(x), len(y)) - 1
        while n < cap and x[n] == y[n]:
            n += 1
        return n

    adjacent = [common(order[k], order[k + 1]) for k in range(B - 1)]
    everyone = min(adjacent)  # in token order, the batch-wide common prefix
    runs, start = [], 0
    for k in range(1, B + 1):
        if k == B or adjacent[k - 1] < everyone + min_len:
            if k - start > 1:
                runs.append((order[start:k], min(adjacent[start:k - 1])))
            start = k
    batch_wide = everyone if everyone >= min_len else 0
    # prefill tokens: batch-wide = its prefix once + every row's rest; groups = each group's
    # prefix once + every row's rest after its group's prefix (after nothing, if in none)
    saved = sum((len(rows) - 1) * n for rows, n in runs) - (B - 1) * batch_wide
    return runs if runs and saved >= min_saving else []


def longest_stored_prefix(store: dict, prompt: list[int]) -> tuple[int, Any]:
    """(length, per-layer KV) of the longest stored token sequence that is a proper prefix of
    ``prompt`` (the prompt keeps >= 1 token to prefill), or (0, None)."""
    best, hit = 0, None
    for ids, kv in store.items():
        n = len(ids)
        if best < n < len(prompt) and tuple(prompt[:n]) == ids:
            best, hit = n, kv
    return best, hit


def keep_row_kv(store: dict, max_entries: int, ids: list[int], cache: Any, row: int,
                valid: Any) -> None:
    """Store row ``row`` of a transformers cache (its ``valid`` positions) under ``ids``,
    dropping the oldest entries beyond ``max_entries``."""
    store[tuple(ids)] = [(layer.keys[row][:, valid].clone(), layer.values[row][:, valid].clone())
                         for layer in cache.layers]
    while len(store) > max_entries:
        store.pop(next(iter(store)))
