"""The ``hf`` backend: transformers + PEFT, on CPU or CUDA.

Roles are PEFT LoRA adapters on one shared base model (one copy of the base in memory,
separate trainable parameters per role). Options:

* ``shared_adapter=True``: every role maps to ONE adapter named ``"shared"`` (the "no separate
  parameters" ablation);
* ``separate_bases=True``: each role gets its own base model with its own adapter;
* ``lora=None``: full fine-tuning; each role gets a full trainable copy of the model and
  ``adapter=None`` uses a frozen copy of the base (cheap for the 135M embedded model only).

Generation is our own decode loop rather than ``model.generate``: left-padded batched prefill
(prefixes common to the batch or a group of rows prefilled once: :mod:`.prefix_sharing`), KV
cache, finished rows dropped, stop strings checked on the decoded completion, and the sampling
log-prob of every token recorded (see :mod:`crl_bench.llm.sampling`).
Position ids are computed from the attention mask both here and in the training forward, so
recomputed log-probs equal the sampling ones (<= 1e-3 in fp32; tested).

Thread safety: switching the active adapter is global state of the PEFT model, so every public
method holds :attr:`HFBackend.lock` (a re-entrant lock). A trainer running in another thread must
hold ``backend.lock`` across its forward and backward passes.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from crl_bench.llm.batching import collate_sequences, position_ids_from_mask
from crl_bench.llm.models import (DEFAULT_MODEL, load_causal_lm, load_tokenizer, pick_device,
                                  pick_dtype, resolve_model)
from crl_bench.llm.prefix_sharing import (keep_row_kv, longest_stored_prefix, prefix_runs,
                                         scored_prefix_length, shared_prefix_length)
from crl_bench.llm.sampling import sample_next_tokens
from crl_bench.llm.types import Generation, LoraSpec, ModelInfo, SamplingParams

BASE = "__base__"   # PEFT's name for "no adapter" in mixed batches
SHARED = "shared"   # the one adapter of shared_adapter=True


def chat_prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through ``tokenizer``'s chat template, ending with the assistant
    header (newer transformers return a mapping: its ``input_ids``)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


class HFBackend:
    """transformers/PEFT backend. See the module docstring for the role layouts.

    Args:
        model_name: a known short name (``smollm2-135m``, ``tiny-random``), a folder or a hub id.
        roles: role names; each becomes a LoRA adapter (or a full model copy).
        lora: adapter shape; None = full fine-tuning.
        separate_bases: one base model per role instead of one shared base.
        shared_adapter: all roles share one adapter (ablation of separate parameters).
        dtype: ``"auto"`` (bf16 on capable CUDA, fp32 on CPU), ``"float32"``, ``"bfloat16"``...
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        seed: seeds the LoRA initialisation.
        max_batch_size: generate/logprobs split larger requests into chunks of this many rows.
        share_prompt_prefix: compute the KV of a prefix common to a batch's prompts once, in
            generation and in scored (training) forwards.
    """

    kind = "hf"

    def __init__(self, model_name: str = DEFAULT_MODEL, *,
                 roles: tuple[str, ...] = ("actor", "extractor"),
                 lora: LoraSpec | None = LoraSpec(), separate_bases: bool = False,
                 shared_adapter: bool = False, dtype: str = "auto", device: str = "auto",
                 seed: int = 0, max_batch_size: int = 64,
                 share_prompt_prefix: bool = True, empty_init: bool = False) -> None:
        """``empty_init``: build the models on the meta device from the config, reading no
        weights (a sharded learner materialises its shards and fills them from rank 0:
        ``crl_bench.distributed.fsdp.ShardedLearner``)."""
        import torch

        roles = tuple(roles)
        if not roles or len(set(roles)) != len(roles):
            raise ValueError(f"roles must be distinct non-empty names, got {roles!r}.")
        if any(r in (BASE, SHARED, "default") or not r for r in roles):
            raise ValueError(f"role names {BASE!r}, {SHARED!r} and 'default' are reserved.")
        if separate_bases and shared_adapter:
            raise ValueError("separate_bases=True and shared_adapter=True contradict each other: "
                             "one shared adapter needs one shared base. Pick one.")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}.")
        self.model_name = model_name
        self.path = resolve_model(model_name)
        self.roles = roles
        self.lora = lora
        self.separate_bases = separate_bases
        self.shared_adapter = shared_adapter
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.max_batch_size = int(max_batch_size)
        self.share_prompt_prefix = bool(share_prompt_prefix)
        self.min_shared_prefix = 8
        self.min_run_saving = 64  # prefill tokens that per-group prompt prefixes must save
        # KV kept across generate calls (multi-turn conversations): (model key, adapter) ->
        # {token ids tuple: per-layer (keys, values) [H, L, D]}; off until keep_kv_across_calls()
        self.kv_cache_entries = 0
        self._kv_store: dict[tuple[str, str | None], dict[tuple[int, ...], list[tuple[Any, Any]]]] = {}
        self.kv_stats = {"reused_tokens": 0, "prefilled_tokens": 0}
        # training forwards: tokens run through the model, and prefix tokens shared instead
        self.train_stats = {"model_tokens": 0, "shared_tokens": 0}
        self.lock = threading.RLock()
        self.tokenizer = load_tokenizer(model_name)

        # key -> module; role -> (key, peft adapter name or None for full fine-tuning)
        self._models: dict[str, Any] = {}
        self._route_table: dict[str | None, tuple[str, str | None]] = {}
        adapter_names = [SHARED] if shared_adapter else list(roles)

        def load() -> Any:
            if empty_init:
                from transformers import AutoConfig, AutoModelForCausalLM

                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.path))
                return model.to(self.dtype).eval()
            return load_causal_lm(self.path, dtype=str(self.dtype).replace("torch.", ""),
                                  device=self.device)

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if lora is None:
                base = load()
                base.requires_grad_(False)
                self._models["base"] = base
                for name in adapter_names:
                    model = copy.deepcopy(base)
                    model.requires_grad_(True)
                    self._models[name] = model
                for role in roles:
                    self._route_table[role] = (SHARED if shared_adapter else role, None)
                self._route_table[None] = ("base", None)
            else:
                from peft import get_peft_model

                config = lora.to_peft()
                if separate_bases:
                    for role in roles:
                        self._models[role] = get_peft_model(load(), config, adapter_name=role)
                        self._route_table[role] = (role, role)
                    self._route_table[None] = (roles[0], None)
                else:
                    model = get_peft_model(load(), config, adapter_name=adapter_names[0])
                    for name in adapter_names[1:]:
                        model.add_adapter(name, config)
                    self._models["main"] = model
                    for role in roles:
                        self._route_table[role] = ("main", SHARED if shared_adapter else role)
                    self._route_table[None] = ("main", None)
                for model in self._models.values():
                    self._unfreeze_lora(model)
                    model.eval()
        self._active: dict[str, str | None] = {}
        any_model = next(iter(self._models.values()))
        self._cache_kwarg = self._find_cache_kwarg(any_model)
        eos = set()
        for value in (self.tokenizer.eos_token_id, getattr(any_model.generation_config,
                                                           "eos_token_id", None)):
            if isinstance(value, int):
                eos.add(value)
            elif value:
                eos.update(int(v) for v in value)
        self.eos_token_ids: frozenset[int] = frozenset(eos)

    # -- routing ---------------------------------------------------------------------------------
    def _route(self, adapter: str | None) -> tuple[str, str | None]:
        if adapter not in self._route_table:
            known = ", ".join(repr(r) for r in self.roles)
            raise KeyError(f"Unknown adapter {adapter!r}. This backend serves roles {known} "
                           f"(or None for the base model).")
        return self._route_table[adapter]

    @staticmethod
    def _unfreeze_lora(model: Any) -> None:
        # PEFT's set_adapter freezes the inactive adapters; every role's LoRA weights stay
        # trainable so that optimisers built from trainable_parameters() keep working.
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.requires_grad_(True)

    @staticmethod
    def _find_cache_kwarg(model: Any) -> str:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        return "cache" if "cache" in params else "past_key_values"

    def _is_peft(self, key: str) -> bool:
        return self.lora is not None

    @contextlib.contextmanager
    def _activated(self, key: str, adapter_name: str | None | object) -> Iterator[Any]:
        """The module ``key`` with ``adapter_name`` active (None: adapters disabled; _MIXED: as
        it is, the forward's ``adapter_names`` picks an adapter per row)."""
        model = self._models[key]
        if not self._is_peft(key) or adapter_name is _MIXED:
            yield model
            return
        if adapter_name is None:
            with model.disable_adapter():
                yield model
            return
        if self._active.get(key) != adapter_name:
            model.set_adapter(adapter_name)
            self._unfreeze_lora(model)
            self._active[key] = adapter_name
        yield model

    # -- prompts ---------------------------------------------------------------------------------
    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of ``messages`` through the chat template, ending with the assistant header."""
        return chat_prompt_ids(self.tokenizer, messages)

    def _as_ids(self, prompts: Sequence[Sequence[int]] | Sequence[str]) -> list[list[int]]:
        ids = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):  # verbatim text; use chat_prompt_ids for chat formatting
                ids.append(self.tokenizer(p, add_special_tokens=False)["input_ids"])
            else:
                ids.append([int(t) for t in p])
            if not ids[-1]:
                raise ValueError(f"prompt {i} is empty.")
        return ids

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]] | Sequence[str], sampling: SamplingParams,
                 adapter: str | None | Sequence[str | None] = "actor", *,
                 max_new_tokens: Sequence[int] | None = None) -> list[Generation]:
        """Sample one completion per prompt, batched.

        Args:
            prompts: token id lists (e.g. from :meth:`chat_prompt_ids`) or verbatim strings.
            sampling: temperature / top-p / top-k / max_new_tokens / stop / seed.
            adapter: a role name, None for the base model, or one per prompt (mixed batch).
            max_new_tokens: optional per-prompt caps (each <= sampling.max_new_tokens applies).

        Returns:
            One :class:`Generation` per prompt, in order.
        """
        import torch

        ids = self._as_ids(prompts)
        n = len(ids)
        adapters = list(adapter) if isinstance(adapter, (list, tuple)) else [adapter] * n
        if len(adapters) != n:
            raise ValueError(f"{len(adapters)} adapters for {n} prompts.")
        caps = [sampling.max_new_tokens] * n
        if max_new_tokens is not None:
            if len(max_new_tokens) != n:
                raise ValueError(f"{len(max_new_tokens)} max_new_tokens for {n} prompts.")
            caps = [max(1, min(int(c), sampling.max_new_tokens)) for c in max_new_tokens]
        routes = [self._route(a) for a in adapters]
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(int(sampling.seed))
        results: list[Generation | None] = [None] * n
        groups: dict[str, list[int]] = {}
        for i, (key, _) in enumerate(routes):
            groups.setdefault(key, []).append(i)
        with self.lock, torch.no_grad():
            for key, rows in groups.items():
                if len(rows) > self.max_batch_size:  # similar lengths together: less padding
                    rows = sorted(rows, key=lambda i: len(ids[i]))
                for start in range(0, len(rows), self.max_batch_size):
                    chunk = rows[start:start + self.max_batch_size]
                    gens = self._generate_batch(key, [ids[i] for i in chunk],
                                                [routes[i][1] for i in chunk], sampling,
                                                [caps[i] for i in chunk], generator)
                    for i, g in zip(chunk, gens):
                        results[i] = g
        return results  # type: ignore[return-value]

    # -- KV reuse across calls ---------------------------------------------------------------------
    def keep_kv_across_calls(self, max_entries: int = 256) -> None:
        """Keep each finished row's KV (its prompt + completion but the last token) for up to
        ``max_entries`` sequences; a later prompt that extends one of them is prefilled from
        there on only (a "full" multi-turn conversation re-prefills nothing but the new
        observation). Cleared when the weights change (:meth:`after_update`,
        :meth:`load_adapters`); 0 turns it off."""
        self.kv_cache_entries = int(max_entries)
        if not self.kv_cache_entries:
            self._kv_store.clear()

    def _forward_kwargs(self, adapter_names: list[str | None]) -> tuple[str | None | object, dict]:
        """(uniform adapter or MIXED, extra forward kwargs) for a batch."""
        if len(set(adapter_names)) == 1:
            return adapter_names[0], {}
        return _MIXED, {"adapter_names": [a if a is not None else BASE for a in adapter_names]}

    def _generate_batch(self, key: str, prompt_ids: list[list[int]], adapter_names: list[str | None],
                        sampling: SamplingParams, caps: list[int], generator: Any) -> list[Generation]:
        import torch

        B = len(prompt_ids)
        uniform, extra = self._forward_kwargs(adapter_names)
        # Rows of one adapter that start with the same tokens (system prompt, goal; a GRPO
        # group's identical first prompts) share that prefix's KV: it is computed once and
        # repeated. Layout per row: [shared prefix | left padding | own suffix]; positions count
        # real tokens only, so every token sees the same positions as without sharing.
        store = None
        hits: list[tuple[int, Any]] = [(0, None)] * B
        if self.kv_cache_entries and uniform is not _MIXED:
            store = self._kv_store.setdefault((key, uniform), {})
            hits = [longest_stored_prefix(store, p) for p in prompt_ids]
        # No KV kept from earlier calls: rows that share more than the whole batch does (a GRPO
        # group's prompt, equal up to its episode's example answer) get that longer prefix's KV
        # computed once per group, when that prefills fewer tokens than the batch-wide prefix.
        runs = (self._prefix_runs(prompt_ids)
                if uniform is not _MIXED and not any(n for n, _ in hits) else [])
        for rows, n in runs:
            for b in rows:
                hits[b] = (n, None)
        C = max(n for n, _ in hits)
        shared = self._shared_prefix_length(prompt_ids) if uniform is not _MIXED and not C else 0
        # Layout per row: [cached KV, left-padded to C | shared prefix | left padding | own
        # suffix]; positions count real tokens only, so every token sees the positions (and the
        # cached keys their RoPE) it would have without reuse or sharing.
        suffixes = [p[max(shared, n):] for p, (n, _) in zip(prompt_ids, hits)]
        S = max(len(x) for x in suffixes)
        pad = int(self.tokenizer.pad_token_id)
        input_ids = torch.full((B, S), pad, dtype=torch.long)
        attention = torch.zeros((B, C + shared + S), dtype=torch.long)
        attention[:, C:C + shared] = 1
        for b, x in enumerate(suffixes):
            input_ids[b, S - len(x):] = torch.tensor(x, dtype=torch.long)
            attention[b, C - hits[b][0]:C] = 1
            attention[b, C + shared + S - len(x):] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = position_ids_from_mask(attention)[:, C + shared:]
        next_pos = positions[:, -1] + 1
        computed = sum(n for _, n in runs)  # each group's prefix, prefilled once
        self.kv_stats["reused_tokens"] += sum(n for n, _ in hits) - computed
        self.kv_stats["prefilled_tokens"] += sum(len(x) for x in suffixes) + shared + computed

        names = list(adapter_names)
        completions: list[list[int]] = [[] for _ in range(B)]
        logprobs: list[list[float]] = [[] for _ in range(B)]
        finish: list[str | None] = [None] * B
        active = list(range(B))
        model = self._models[key]
        with self._activated(key, uniform):
            if uniform is _MIXED:
                model.eval()  # PEFT only allows per-row adapters in eval mode
            for rows, n in runs:
                kv = self._prefix_kv(model, prompt_ids[rows[0]][:n])
                for b in rows:
                    hits[b] = (n, kv)
            cache = self._new_cache(model)
            if C:
                ref = next(kv for n, kv in hits if kv is not None)
                for layer_idx, (k_ref, v_ref) in enumerate(ref):
                    H, D = k_ref.shape[0], k_ref.shape[-1]
                    keys = k_ref.new_zeros((B, H, C, D))
                    values = v_ref.new_zeros((B, H, C, v_ref.shape[-1]))
                    for b, (n, kv) in enumerate(hits):
                        if kv is not None:
                            keys[b, :, C - n:] = kv[layer_idx][0]
                            values[b, :, C - n:] = kv[layer_idx][1]
                    cache.update(keys, values, layer_idx)
                for b, (n, _) in enumerate(hits):
                    if n and store is not None and not runs:
                        store.pop(tuple(prompt_ids[b][:n]), None)
            if shared:
                prefix = torch.tensor([prompt_ids[0][:shared]], dtype=torch.long,
                                      device=self.device)
                model(input_ids=prefix, attention_mask=torch.ones_like(prefix),
                      position_ids=torch.arange(shared, device=self.device)[None],
                      use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
                cache.batch_repeat_interleave(B)
            out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                        use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache}, **extra)
            logits = out.logits[:, -1, :]
            while True:
                tokens, lps = sample_next_tokens(logits, sampling.temperature, sampling.top_k,
                                                 sampling.top_p, generator)
                tokens_list, lps_list = tokens.tolist(), lps.tolist()
                keep = []
                for j, row in enumerate(active):
                    tok = tokens_list[j]
                    completions[row].append(tok)
                    logprobs[row].append(lps_list[j])
                    if tok in self.eos_token_ids:
                        finish[row] = "eos"
                    elif sampling.stop and self._hits_stop(completions[row], sampling.stop):
                        finish[row] = "stop"
                    elif len(completions[row]) >= caps[row]:
                        finish[row] = "length"
                    else:
                        keep.append(j)
                        continue
                    if store is not None:  # the KV of everything fed so far, for the next call
                        keep_row_kv(store, self.kv_cache_entries,
                                    prompt_ids[row] + completions[row][:-1], cache, j,
                                    attention[j].bool())
                if not keep:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, dtype=torch.long, device=self.device)
                    cache.batch_select_indices(index)
                    attention, next_pos, tokens = attention[index], next_pos[index], tokens[index]
                    active = [active[j] for j in keep]
                    if extra:
                        names = [names[j] for j in keep]
                        uniform, extra = self._forward_kwargs(names)
                        if uniform is not _MIXED:  # the rest share one adapter: stay mixed-mode
                            extra = {"adapter_names": [a if a is not None else BASE
                                                       for a in names]}
                attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=1)
                out = model(input_ids=tokens[:, None], attention_mask=attention,
                            position_ids=next_pos[:, None], use_cache=True,
                            **{self._cache_kwarg: cache}, **extra)
                next_pos = next_pos + 1
                logits = out.logits[:, -1, :]
        return [Generation(prompt_ids=list(prompt_ids[b]), completion_ids=completions[b],
                           logprobs=logprobs[b],
                           text=self.tokenizer.decode(completions[b], skip_special_tokens=True),
                           finish_reason=finish[b] or "length") for b in range(B)]

    # prefix sharing (see crl_bench.llm.prefix_sharing); off -> nothing shared
    def _shared_prefix_length(self, prompt_ids: list[list[int]]) -> int:
        on = self.share_prompt_prefix
        return shared_prefix_length(prompt_ids, self.min_shared_prefix) if on else 0

    def _scored_prefix_length(self, input_ids: Any, attention_mask: Any, scored: Any) -> int:
        on, n = self.share_prompt_prefix, self.min_shared_prefix
        return scored_prefix_length(input_ids, attention_mask, scored, n) if on else 0

    def _prefix_runs(self, prompt_ids: list[list[int]]) -> list[tuple[list[int], int]]:
        on, n = self.share_prompt_prefix, self.min_shared_prefix
        return prefix_runs(prompt_ids, n, self.min_run_saving) if on else []

    def _prefix_kv(self, model: Any, ids: list[int]) -> list[tuple[Any, Any]]:
        """Per layer (keys, values) [heads, len(ids), dim] of ``ids`` encoded alone."""
        import torch

        cache = self._new_cache(model)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        model(input_ids=x, attention_mask=torch.ones_like(x),
              position_ids=torch.arange(len(ids), device=self.device)[None], use_cache=True,
              logits_to_keep=1, **{self._cache_kwarg: cache})
        return [(layer.keys[0], layer.values[0]) for layer in cache.layers]

    @staticmethod
    def _new_cache(model: Any) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=model.config)
        except TypeError:  # older transformers
            return DynamicCache()

    def _hits_stop(self, completion: list[int], stops: tuple[str, ...]) -> bool:
        text = self.tokenizer.decode(completion, skip_special_tokens=True)
        return any(s in text for s in stops)

    # -- scoring ---------------------------------------------------------------------------------
    def forward_token_logprobs(self, adapter: str | None, input_ids: Any, attention_mask: Any, *,
                               temperature: float = 1.0, return_entropy: bool = False,
                               score_mask: Any = None, chunk_tokens: int = 0) -> Any:
        """Differentiable per-token log-probs of a padded batch.

        Args:
            adapter: role whose adapter is active (None = base model).
            input_ids: [B, T] int64 (left or right padded).
            attention_mask: [B, T], 1 on real tokens.
            temperature: logits are divided by it (use SamplingParams.logprob_temperature to
                match the sampling log-probs).
            return_entropy: also return the entropy of each next-token distribution.
            score_mask: optional [B, T-1] bool, the positions whose log-probs are needed (the
                completion tokens when training). Only those go through the vocabulary
                projection: a [B, T, vocab] float32 logits tensor is 629 MB for 8 x 400 tokens of
                SmolLM2, and training needs the completion positions only. Other positions are 0.
            chunk_tokens: if > 0, the scored positions' log-probs are computed this many at a
                time, each chunk's logits recomputed in the backward
                (:mod:`crl_bench.llm.chunked_logprobs`): the logits of all scored tokens never
                exist at once. Same values and gradients.

        Returns:
            logprobs [B, T-1] float32 with ``logprobs[:, t] = log p(input_ids[:, t+1] |
            input_ids[:, :t+1])`` (0 where ``attention_mask[:, t+1] == 0`` or outside
            ``score_mask``), and with ``return_entropy`` a tuple ``(logprobs, entropy)``, entropy
            [B, T-1] in nats.
        """
        import torch

        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}; for greedy sampling "
                             "use SamplingParams.logprob_temperature (1.0).")
        key, name = self._route(adapter)
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        valid = attention_mask[:, 1:].bool()
        if chunk_tokens > 0 and score_mask is None:
            score_mask = valid  # the chunked head takes the scored positions' hidden states
        if score_mask is not None:
            score_mask = score_mask.to(self.device).bool()
            if score_mask.shape != valid.shape:
                raise ValueError(f"score_mask must be [B, T-1] = {tuple(valid.shape)}, got "
                                 f"{tuple(score_mask.shape)}")
            valid = valid & score_mask
            # logits at position t predict token t+1: keep the positions with a scored target
            keep = torch.cat([valid, torch.zeros_like(valid[:, :1])], dim=1)
            extra = {"logits_to_keep": keep}
        else:
            extra = {}
        shared = self._scored_prefix_length(input_ids, attention_mask, valid) if extra else 0
        positions = position_ids_from_mask(attention_mask)
        head = contextlib.nullcontext()
        with self.lock, self._activated(key, name) as model:
            if chunk_tokens > 0:
                from crl_bench.llm.chunked_logprobs import chunked_head

                head = chunked_head(model, input_ids[:, 1:][valid], temperature=temperature,
                                    chunk_tokens=chunk_tokens, entropy=return_entropy)
            with head:
                out = self._scoring_forward(model, input_ids, attention_mask, positions, extra,
                                            shared)
            saved = shared * (input_ids.shape[0] - 1)
            self.train_stats["model_tokens"] += int(attention_mask.sum()) - saved
            self.train_stats["shared_tokens"] += saved
        targets = input_ids[:, 1:]
        if chunk_tokens > 0:  # out.logits: [N, 1] log-probs (+ entropy) of the scored tokens
            if out.logits.dim() != 2:
                raise RuntimeError("the chunked output layer did not get the scored positions' "
                                   f"hidden states: logits {tuple(out.logits.shape)}")
            picked = out.logits[:, 0]
            entropy = out.logits[:, 1] if return_entropy else None
        elif score_mask is not None:
            logits = out.logits.float()  # [N, vocab]: the kept positions only
            targets = targets[valid]
        else:
            logits = out.logits[:, :-1, :].float()
        if chunk_tokens <= 0:
            if temperature != 1.0:
                logits = logits / temperature
            normaliser = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(-1, targets[..., None]).squeeze(-1) - normaliser
            entropy = ((normaliser - (logits.softmax(dim=-1) * logits).sum(dim=-1))
                       if return_entropy else None)
        if score_mask is not None:
            token_logprobs = picked.new_zeros(valid.shape).masked_scatter(valid, picked)
            if entropy is not None:
                entropy = entropy.new_zeros(valid.shape).masked_scatter(valid, entropy)
        else:
            token_logprobs = torch.where(valid, picked, torch.zeros_like(picked))
            if entropy is not None:
                entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
        if not return_entropy:
            return token_logprobs
        return token_logprobs, entropy

    def _scoring_forward(self, model: Any, input_ids: Any, attention_mask: Any, positions: Any,
                         extra: dict[str, Any], shared: int) -> Any:
        """The model's forward of :meth:`forward_token_logprobs` (a shared prompt prefix, when
        ``shared`` > 0, encoded once)."""
        import torch

        if shared:
            # Rows that start with the same tokens (a GRPO group's prompt) encode that prefix
            # once: its KV, with its graph, is repeated for every row, and only the rows' own
            # tokens run as a batch. The gradient through the prefix is the rows' sum, as it
            # is when every row encodes it: same log-probs, same gradients, fewer tokens.
            cache = self._new_cache(model)
            prefix = input_ids[:1, :shared]
            model(input_ids=prefix, attention_mask=torch.ones_like(prefix),
                  position_ids=positions[:1, :shared], use_cache=True, logits_to_keep=1,
                  **{self._cache_kwarg: cache})
            cache.batch_repeat_interleave(input_ids.shape[0])
            out = model(input_ids=input_ids[:, shared:], attention_mask=attention_mask,
                        position_ids=positions[:, shared:], use_cache=True,
                        logits_to_keep=extra["logits_to_keep"][:, shared:],
                        **{self._cache_kwarg: cache})
        else:
            out = model(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=positions, use_cache=False, **extra)
        return out

    def logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                 adapter: str | None = "actor", *, temperature: float = 1.0) -> list[list[float]]:
        """Log-probs of each completion token given its prompt (no gradient), micro-batched."""
        import torch

        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions.")
        out: list[list[float]] = []
        with torch.no_grad():
            for start in range(0, len(prompt_ids), self.max_batch_size):
                batch = collate_sequences(prompt_ids[start:start + self.max_batch_size],
                                          completion_ids[start:start + self.max_batch_size],
                                          self.tokenizer.pad_token_id)
                values = self.forward_token_logprobs(adapter, batch.input_ids,
                                                     batch.attention_mask, temperature=temperature)
                out.extend(batch.completion_values(values.cpu()))
        return out

    # -- training access -------------------------------------------------------------------------
    def trainable_model(self, adapter: str) -> Any:
        """The module whose forward trains ``adapter`` (a PEFT model with it active)."""
        if adapter is None:
            raise ValueError("The base model is frozen; name a role to train, e.g. 'actor'.")
        key, name = self._route(adapter)
        with self.lock, self._activated(key, name) as model:
            return model

    def trainable_parameters(self, adapter: str) -> list[Any]:
        """The parameters an optimiser for ``adapter`` should update (LoRA A/B, or all weights)."""
        if adapter is None:
            raise ValueError("The base model is frozen; name a role to train, e.g. 'actor'.")
        key, name = self._route(adapter)
        model = self._models[key]
        if name is None:
            return [p for p in model.parameters()]
        marker = f".{name}."
        params = [p for n, p in model.named_parameters() if "lora_" in n and marker in n]
        for p in params:
            p.requires_grad_(True)
        return params

    def after_update(self, adapter: str) -> None:
        """Generation reads the same weights the optimiser updates; KV kept across calls
        (:meth:`keep_kv_across_calls`) was computed with the old ones and is dropped."""
        self._route(adapter)
        self._kv_store.clear()

    # -- persistence: the roles' trainable weights (adapters, or whole models) -----------------
    def _stored_units(self) -> list[tuple[str, str, str | None]]:
        """(folder name, model key, peft adapter name) of everything trainable."""
        units: dict[str, tuple[str, str, str | None]] = {}
        for role in self.roles:
            key, name = self._route(role)
            folder = name if name is not None else key
            units[folder] = (folder, key, name)
        return list(units.values())

    def save_adapters(self, directory: str | Path) -> None:
        """Write each role's adapter to ``directory/<adapter>/`` (PEFT format) + ``roles.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self.lock:
            for folder, key, name in self._stored_units():
                model = self._models[key]
                if name is None:
                    model.save_pretrained(str(directory / folder), safe_serialization=True)
                else:
                    model.save_pretrained(str(directory), selected_adapters=[name])
        manifest = {"model_name": self.model_name, "roles": list(self.roles),
                    "routes": {r: list(self._route(r)) for r in self.roles},
                    "lora": None if self.lora is None else {
                        "r": self.lora.r, "alpha": self.lora.alpha, "dropout": self.lora.dropout,
                        "target_modules": list(self.lora.target_modules)}}
        (directory / "roles.json").write_text(json.dumps(manifest, indent=2))

    def save_adapter(self, adapter: str, directory: str | Path) -> Path:
        """Write one role's adapter in PEFT format into ``directory`` itself; return the folder."""
        import tempfile

        key, name = self._route(adapter)
        if name is None:
            raise ValueError("save_adapter needs a LoRA role; full fine-tuning saves whole models "
                             "with save_adapters().")
        directory = Path(directory)
        with self.lock, tempfile.TemporaryDirectory(dir=directory.parent if directory.parent.exists()
                                                    else None) as tmp:
            self._models[key].save_pretrained(tmp, selected_adapters=[name])
            directory.mkdir(parents=True, exist_ok=True)
            for f in (Path(tmp) / name).iterdir():
                f.replace(directory / f.name)
        return directory

    def load_adapters(self, directory: str | Path) -> None:
        """Load what :meth:`save_adapters` wrote (same roles and adapter layout)."""
        directory = Path(directory)
        self._kv_store.clear()
        manifest_path = directory / "roles.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{directory} has no roles.json; it was not written by "
                                    "save_adapters().")
        with self.lock:
            for folder, key, name in self._stored_units():
                path = directory / folder
                if not path.is_dir():
                    raise FileNotFoundError(f"{path} is missing: the saved roles do not match this "
                                            f"backend's roles {self.roles}.")
                if name is None:
                    from safetensors.torch import load_file

                    state = {}
                    for f in sorted(path.glob("*.safetensors")):
                        state.update(load_file(str(f), device=str(self.device)))
                    self._models[key].load_state_dict(state, strict=False)
                else:
                    from peft.utils import load_peft_weights, set_peft_model_state_dict

                    weights = load_peft_weights(str(path), device=str(self.device))
                    result = set_peft_model_state_dict(self._models[key], weights, adapter_name=name)
                    unexpected = getattr(result, "unexpected_keys", [])
                    if unexpected:
                        raise ValueError(f"Adapter {path} does not fit this model: unexpected "
                                         f"keys {unexpected[:5]}...")

    def info(self) -> ModelInfo:
        return ModelInfo(model_name=self.model_name, path=self.path,
                         dtype=str(self.dtype).replace("torch.", ""), device=self.device,
                         roles=self.roles,
                         adapters={r: self._route(r)[1] for r in self.roles})


_MIXED = object()
