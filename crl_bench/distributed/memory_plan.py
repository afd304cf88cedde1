"""Memory and time plan of a GPU run: bytes per GPU for each role, checked before anything starts.

``crl-bench plan --preset paper --gpus 16 --gpu-memory 80`` lays the run's roles on the GPUs of a
:class:`~crl_bench.distributed.plan.ResourcePlan` (the paper's split: half the GPUs for the actor,
half for the extractor; each half into generation engines and learner ranks) and counts, per GPU:

* a **learner rank** (FSDP over the role's learner ranks, full fine-tuning): bf16 weights (2 B per
  parameter), bf16 gradients (2 B), fp32 master weights (4 B), AdamW's two fp32 moments (8 B):
  16 B per parameter, sharded over the ranks; the all-gathered bf16 layers FSDP holds while it
  computes (two layers: the current one and the prefetched next); the activations of the largest
  micro-batch, with and without activation checkpointing per decoder layer; the vocabulary
  projection's logits of the scored tokens; the optimiser step's temporaries (which do not coexist
  with the activations).
* a **vLLM engine**: the bf16 weights over its tensor-parallel GPUs and the KV cache that the rest
  of ``gpu_memory_utilization`` leaves, in tokens and in full-length sequences.

Activation bytes follow what autograd saves in the transformers implementation of a Qwen2 / Qwen3
decoder layer with SDPA (flash kernel, no dropout); the count is checked against the bytes saved
by a real forward pass (tests/test_memory_plan.py) and against a measured peak
(benchmarks/plan_memory.py). A plan that does not fit is refused, with the changes that would make
it fit (more ranks, checkpointing, a token budget per micro-batch, shorter episodes).

Nothing here imports torch: it is arithmetic on architecture numbers and the run configuration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

GB = 1e9
"""Memory is printed in GB (10^9 bytes); ``--gpu-memory`` is read in the same unit (an 80 GB
H100 has 85.9e9 bytes; 80 is the conservative reading)."""


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a decoder-only transformer (the fields of its ``config.json``).

    Attributes:
        name: hub id.
        layers, hidden, intermediate, heads, kv_heads, head_dim, vocab: ``num_hidden_layers``,
            ``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
            ``num_key_value_heads``, ``head_dim`` (``hidden / heads`` when the config has none),
            ``vocab_size``.
        tie_embeddings: ``tie_word_embeddings`` (the LM head is the embedding matrix).
        qkv_bias: q/k/v projections have biases (Qwen2) or not (Qwen3).
        qk_norm: per-head RMSNorm on queries and keys (Qwen3).
        source: where the numbers come from.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attn + 3 * h * self.intermediate + norms

    def params(self) -> int:
        """Every parameter (embedding, layers, final norm, LM head unless tied)."""
        embed = self.vocab * self.hidden
        head = 0 if self.tie_embeddings else embed
        return embed + head + self.layers * self.layer_params() + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache per token: keys and values of every layer, ``2 * layers * kv_heads * head_dim
        * dtype_bytes``."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def activation_bytes_per_token(self, compute_bytes: int = 2) -> int:
        """Bytes autograd keeps per token per decoder layer for the backward pass (no
        checkpointing), ``c = compute_bytes``:

        * each of the 2 RMSNorms: its input upcast to fp32 (4h), the normalised value cast back
          (c h), its product with the weight (c h, the next projection's input), 1/rms (4);
        * attention: queries (c q_dim), keys and values (2 c kv_dim), the SDPA output (c q_dim)
          and its log-sum-exp (4 per head); with q/k norms (Qwen3) their fp32 inputs, normalised
          values and 1/rms as above;
        * SwiGLU MLP: gate, SiLU(gate), up and their product (4 c intermediate).
        """
        c, h = compute_bytes, self.hidden
        norms = 2 * (4 * h + 2 * c * h + 4)
        attn = c * (2 * self.q_dim + 2 * self.kv_dim) + 4 * self.heads
        if self.qk_norm:
            attn += (4 + c) * (self.q_dim + self.kv_dim) + 4 * (self.heads + self.kv_heads)
        return norms + attn + 4 * c * self.intermediate

    def logits_bytes_per_token(self) -> int:
        """Peak bytes of the vocabulary projection per scored token, in the backward pass of the
        trainer's log-prob head (``forward_token_logprobs``: fp32 logits / temperature,
        ``logsumexp``, the sampled token's log-prob): the saved fp32 logits, the gradient of the
        ``gather`` (a zero tensor scattered into), the gradient of ``logsumexp`` and their sum,
        4 fp32 values per vocabulary entry (measured: 16.0 B x vocab in bf16 and fp32; the
        forward needs 8)."""
        return 16 * self.vocab


# Published config.json values (huggingface.co/<name>/blob/main/config.json).
QWEN25_7B = ModelShape(
    name="Qwen/Qwen2.5-7B-Instruct", layers=28, hidden=3584, intermediate=18944, heads=28,
    kv_heads=4, head_dim=128, vocab=152064, tie_embeddings=False, qkv_bias=True,
    source="huggingface.co/Qwen/Qwen2.5-7B-Instruct config.json: num_hidden_layers 28, "
           "hidden_size 3584, intermediate_size 18944, num_attention_heads 28, "
           "num_key_value_heads 4, vocab_size 152064, tie_word_embeddings false "
           "(7,615,616,512 parameters, the model card's 7.61B)")
QWEN3_4B = ModelShape(
    name="Qwen/Qwen3-4B-Thinking-2507", layers=36, hidden=2560, intermediate=9728, heads=32,
    kv_heads=8, head_dim=128, vocab=151936, tie_embeddings=True, qk_norm=True,
    source="huggingface.co/Qwen/Qwen3-4B-Thinking-2507 config.json: num_hidden_layers 36, "
           "hidden_size 2560, intermediate_size 9728, num_attention_heads 32, "
           "num_key_value_heads 8, head_dim 128, vocab_size 151936, tie_word_embeddings true "
           "(4,022,468,096 parameters, the model card's 4.0B)")
SHAPES: dict[str, ModelShape] = {s.name: s for s in (QWEN25_7B, QWEN3_4B)}


def shape_from_hf_config(cfg: Any, name: str = "") -> ModelShape:
    """A :class:`ModelShape` from a transformers ``Qwen2Config`` / ``Qwen3Config`` (or any config
    with the same fields)."""
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    model_type = getattr(cfg, "model_type", "")
    return ModelShape(name=name or model_type, layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
                      intermediate=cfg.intermediate_size, heads=heads,
                      kv_heads=cfg.num_key_value_heads, head_dim=head_dim, vocab=cfg.vocab_size,
                      tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
                      qkv_bias=model_type == "qwen2", qk_norm=model_type == "qwen3")


def model_shape(name: str) -> ModelShape:
    if name not in SHAPES:
        raise ValueError(f"no architecture numbers for model {name!r}; the plan knows "
                         f"{', '.join(SHAPES)} (add a ModelShape to crl_bench.distributed."
                         "memory_plan.SHAPES for another model)")
    return SHAPES[name]


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each training state, and of the compute (activations) dtype."""

    name: str
    weight: int
    grad: int
    master: int
    optimizer: int
    compute: int

    @property
    def state_bytes(self) -> int:
        return self.weight + self.grad + self.master + self.optimizer


FSDP2_MIXED = Precision("fsdp2", weight=0, grad=4, master=4, optimizer=8, compute=2)
"""FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the sharded
parameters are the fp32 masters, their gradients fp32, AdamW's moments fp32; bf16 weights exist
only for the gathered layers (the ``fsdp_gather`` line)."""
BF16_FP32_MASTERS = Precision("bf16-masters", weight=2, grad=2, master=4, optimizer=8, compute=2)
"""bf16 weights and gradients beside fp32 masters and moments (Megatron's distributed optimizer
with bf16 gradients; the CPU measurement's mixed-precision update)."""
TRAINER_MASTERS = Precision("trainer", weight=2, grad=4, master=4, optimizer=8, compute=2)
"""The single-process trainer with fp32 masters: bf16 weights, gradients accumulated in fp32."""
FP32 = Precision("fp32", weight=4, grad=4, master=0, optimizer=8, compute=4)
PRECISIONS = {p.name: p for p in (FSDP2_MIXED, BF16_FP32_MASTERS, TRAINER_MASTERS, FP32)}


# -- a learner rank ----------------------------------------------------------------------------
def micro_batch_tokens(micro_batch_size: int, token_budget: int, max_seq: int) -> int:
    """Worst-case padded tokens of one micro-batch as ``trainer.micro_batches`` cuts them: at most
    ``micro_batch_size`` sequences and, with a budget, at most ``token_budget`` padded tokens; a
    sequence longer than the budget goes alone."""
    worst = micro_batch_size * max_seq
    return worst if token_budget <= 0 else max(min(worst, token_budget), max_seq)


def learner_rank(shape: ModelShape, ranks: int, tokens: int, scored: int, *,
                 precision: Precision = FSDP2_MIXED, checkpointing: bool = True,
                 gathered_layers: int = 2, logprob_chunk: int = 0) -> dict[str, float]:
    """Bytes on one learner rank (FSDP over ``ranks``; ``ranks == 1`` is one process, nothing
    gathered) for a micro-batch of ``tokens`` padded tokens of which ``scored`` go through the
    vocabulary projection.

    ``precision`` gives the bytes per parameter of each state (:data:`PRECISIONS`; every mixed
    variant holds 16 B per parameter or, for the single-process trainer, 18).
    ``logprob_chunk``: the trainer's ``logprob_chunk_tokens`` (log-probs over chunks of this many
    scored tokens, each chunk's logits recomputed in the backward): the logits line counts one
    chunk instead of every scored token, plus the two output-layer gradients autograd holds while
    it sums the chunks' contributions (0: every scored token at once).

    Returns a dict of lines (bytes): ``weights``, ``grads``, ``masters``, ``optimizer``,
    ``fsdp_gather``, ``activations`` (at the chosen ``checkpointing``), ``activations_no_ckpt``,
    ``activations_ckpt``, ``logits``, ``step_temp``, ``total`` (= states + gathered layers +
    max(activations + logits, step temporaries)).
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    n = shape.params()
    p = precision
    lines: dict[str, float] = {
        "weights": n * p.weight / ranks, "grads": n * p.grad / ranks,
        "masters": n * p.master / ranks, "optimizer": n * p.optimizer / ranks}
    # the gathered layers' bf16 weights and their unsharded gradients before the reduce-scatter
    lines["fsdp_gather"] = (gathered_layers * shape.layer_params() * p.compute * 2
                            if ranks > 1 else 0.0)
    per_layer = shape.activation_bytes_per_token(p.compute)
    # outside the layers: the final norm over every token and the LM head's input
    outside = (4 * shape.hidden + 2 * p.compute * shape.hidden) * tokens
    no_ckpt = shape.layers * per_layer * tokens + outside
    # checkpointing per layer: each layer keeps its input; backward recomputes one layer at a time
    ckpt = shape.layers * p.compute * shape.hidden * tokens + per_layer * tokens + outside
    lines["activations_no_ckpt"] = float(no_ckpt)
    lines["activations_ckpt"] = float(ckpt)
    lines["activations"] = float(ckpt if checkpointing else no_ckpt)
    at_once = min(scored, logprob_chunk) if logprob_chunk > 0 else scored
    lines["logits"] = float(shape.logits_bytes_per_token() * at_once)
    if logprob_chunk > 0 and scored > logprob_chunk:
        # the output layer's weight gradient arrives once per chunk: autograd sums the chunks'
        # contributions in a buffer while the next one is computed (2 x vocab x hidden; measured
        # by benchmarks/plan_memory.py --precision chunks)
        lines["logits"] += 2.0 * shape.vocab * shape.hidden * p.compute
    # AdamW's update direction (one fp32 tensor per parameter shard, foreach) while the step runs
    lines["step_temp"] = n * 4 / ranks
    states = sum(lines[k] for k in ("weights", "grads", "masters", "optimizer", "fsdp_gather"))
    lines["total"] = states + max(lines["activations"] + lines["logits"], lines["step_temp"])
    return lines


def engine(shape: ModelShape, gpus: float, gpu_bytes: float, utilization: float,
           max_model_len: int, workspace: float = 2 * GB) -> dict[str, float]:
    """Bytes on one GPU of a vLLM engine with tensor-parallel size ``gpus``: its share of the bf16
    weights; ``workspace`` (CUDA graphs, sampler, activations of a prefill chunk; vLLM profiles
    it, ~1-3 GB at these sizes); the KV cache is what ``utilization`` of the GPU leaves. Returns
    ``weights``, ``workspace``, ``kv_cache``, ``kv_tokens`` (the engine's, over all its GPUs),
    ``sequences`` (full-length sequences that fit) and ``total``."""
    weights = shape.params() * 2 / gpus
    kv = utilization * gpu_bytes - weights - workspace
    kv_tokens = max(kv, 0.0) * gpus / shape.kv_bytes_per_token(2)
    return {"weights": weights, "workspace": workspace, "kv_cache": max(kv, 0.0),
            "kv_tokens": kv_tokens, "sequences": kv_tokens / max_model_len,
            "total": weights + workspace + max(kv, 0.0), "short": -kv if kv < 0 else 0.0}


# -- the whole run -----------------------------------------------------------------------------
@dataclass
class RolePlan:
    """One role on its GPUs: what each GPU holds, and whether it fits."""

    role: str
    part: str  # "learner" or "engine"
    count: int
    gpus_each: float
    model: str
    lines: dict[str, float]
    fits: bool
    fixes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class MemoryPlan:
    gpus: int
    gpu_memory_gb: float
    checkpointing: bool
    roles: list[RolePlan]
    times: dict[str, dict[str, float]]
    precision: Precision = FSDP2_MIXED

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.roles)


@dataclass(frozen=True)
class RoleSpec:
    """What the plan needs to know of one trained role."""

    role: str
    shape: ModelShape
    engines: int
    gpus_per_engine: float
    ranks: int
    micro_batch_size: int
    token_budget: int
    max_seq: int
    scored_per_seq: int
    utilization: float
    samples_per_update: int
    prefix: str  # the config section ("actor" / "extractor")
    precision: Precision = FSDP2_MIXED
    logprob_chunk: int = 0  # the section's logprob_chunk_tokens


def split_gpus(gpus: int) -> dict[str, int]:
    """The paper's split of ``gpus`` (16 in the paper: 8 actor, 8 extractor; the official yaml maps
    ``actor_train``/``actor_infer`` to GPUs 0-7 and the memory model to 8-15): half per role, each
    half into generation engines and learner ranks (the ``paper16`` Ray plan's 4 + 4 for the
    actor)."""
    if gpus < 4 or gpus % 4:
        raise ValueError(f"--gpus {gpus}: the plan splits GPUs into 4 equal parts (actor engines, "
                         "actor learner, extractor engines, extractor learner); give a multiple "
                         "of 4 (the paper: 16)")
    q = gpus // 4
    return {"actor_engines": q, "actor_ranks": q, "extractor_engines": q, "extractor_ranks": q}


def role_specs(cfg: Any, split: dict[str, int]) -> list[RoleSpec]:
    """The actor's and the extractor's :class:`RoleSpec` from a ``RunConfig``."""
    actor = model_shape(cfg.model.actor)
    extractor = model_shape(cfg.model.extractor or cfg.model.actor)
    r, a, e = cfg.rollout, cfg.actor, cfg.extractor
    episode = r.max_episode_tokens
    # trajectory samples: the whole episode, the loss on its assistant turns (bounded by the
    # episode); turn samples: one turn's prompt (up to the episode) + its completion
    actor_scored = episode if a.sample_unit == "trajectory" else r.max_new_tokens
    # the extractor reads the whole trajectory (its text) and writes up to max_new_tokens
    ext_seq = episode + e.max_new_tokens
    episodes = r.groups * r.group_size
    return [
        RoleSpec("actor", actor, split["actor_engines"], 1, split["actor_ranks"],
                 a.micro_batch_size, a.micro_batch_tokens, episode, actor_scored, 0.85, episodes,
                 "actor", logprob_chunk=a.logprob_chunk_tokens),
        RoleSpec("extractor", extractor, split["extractor_engines"], 1, split["extractor_ranks"],
                 e.micro_batch_size, e.micro_batch_tokens, ext_seq, e.max_new_tokens, 0.7,
                 e.buffer_size, "extractor", logprob_chunk=e.logprob_chunk_tokens),
    ]


def _learner_lines(spec: RoleSpec, ranks: int, checkpointing: bool, budget: int,
                   max_seq: int) -> dict[str, float]:
    tokens = micro_batch_tokens(spec.micro_batch_size, budget, max_seq)
    seqs = max(1, tokens // max_seq)
    scored = min(tokens, seqs * min(spec.scored_per_seq, max_seq))
    return learner_rank(spec.shape, ranks, tokens, scored, checkpointing=checkpointing,
                        precision=spec.precision, logprob_chunk=spec.logprob_chunk) | {
                            "tokens": float(tokens),
                                                         "scored": float(scored)}


def _learner_fixes(spec: RoleSpec, gpu_bytes: float, checkpointing: bool) -> list[str]:
    """Single changes that make the learner fit, each as the option to give."""
    def fits(ranks: int = spec.ranks, ckpt: bool = checkpointing, budget: int = spec.token_budget,
             seq: int = spec.max_seq) -> bool:
        return _learner_lines(spec, ranks, ckpt, budget, seq)["total"] <= gpu_bytes

    fixes: list[str] = []
    if not spec.logprob_chunk and _learner_lines(
            dataclasses.replace(spec, logprob_chunk=4096), spec.ranks, checkpointing,
            spec.token_budget, spec.max_seq)["total"] <= gpu_bytes:
        fixes.append(f"log-probs over chunks of 4096 tokens (--set "
                     f"{spec.prefix}.logprob_chunk_tokens=4096)")
    if not checkpointing and fits(ckpt=True):
        fixes.append("activation checkpointing per decoder layer (--checkpointing on)")
    for ranks in range(spec.ranks + 1, 8 * spec.ranks + 1):
        if fits(ranks=ranks):
            fixes.append(f"{ranks} {spec.role} learner ranks instead of {spec.ranks} (more GPUs: "
                         f"--gpus {4 * ranks})")
            break
    one_seq = spec.micro_batch_size > 1 and fits(budget=spec.max_seq)
    if one_seq and spec.token_budget != spec.max_seq:
        fixes.append(f"a token budget of one sequence per micro-batch (--set "
                     f"{spec.prefix}.micro_batch_tokens={spec.max_seq})")
    elif one_seq:
        fixes.append(f"a smaller micro-batch (--set {spec.prefix}.micro_batch_size=1)")
    for seq in (32768, 24576, 16384, 12288, 8192, 4096):
        if seq < spec.max_seq and fits(seq=seq, budget=min(spec.token_budget, seq)
                                       if spec.token_budget else 0):
            what = ("rollout.max_episode_tokens" if spec.prefix == "actor"
                    else "rollout.max_episode_tokens / extractor.max_new_tokens")
            fixes.append(f"sequences of at most {seq} tokens instead of {spec.max_seq} ({what})")
            break
    if not fixes:  # combine: checkpointing and one sequence per micro-batch, then ranks or length
        budget = spec.max_seq if spec.micro_batch_size > 1 else spec.token_budget
        base = dict(ckpt=True, budget=budget)
        combo = ["activation checkpointing"] if not checkpointing else []
        if base["budget"] != spec.token_budget:
            combo.append(f"--set {spec.prefix}.micro_batch_tokens={spec.max_seq}")
        more = next((r for r in range(spec.ranks + 1, 8 * spec.ranks + 1) if fits(r, **base)), 0)
        seq = next((q for q in (32768, 24576, 16384, 12288, 8192, 4096, 2048)
                    if q < spec.max_seq and fits(ckpt=True, seq=q, budget=q)), 0)
        if more:
            fixes.append(" + ".join(combo + [f"{more} learner ranks (--gpus {4 * more})"]))
        if seq:
            fixes.append(" + ".join([c for c in combo if c == "activation checkpointing"] + [
                f"sequences of at most {seq} tokens (rollout.max_episode_tokens), one per "
                f"micro-batch (--set {spec.prefix}.micro_batch_tokens={seq})"]))
        if not fixes:
            fixes.append("no combination of checkpointing, a token budget, up to 8x the ranks and "
                         "sequences down to 2048 tokens fits: use GPUs with more memory")
        lines = _learner_lines(spec, spec.ranks, True, base["budget"], spec.max_seq)
        if lines["logits"] > 0.25 * gpu_bytes and not spec.logprob_chunk:
            fixes.append(f"(the logits of {int(lines['scored'])} scored tokens alone take "
                         f"{lines['logits'] / GB:.0f} GB per rank: log-probs over chunks of "
                         f"the sequence bound them, --set {spec.prefix}.logprob_chunk_tokens=4096)")
    return fixes


def build_plan(cfg: Any, gpus: int, gpu_memory_gb: float, *, checkpointing: bool = True,
               precision: str = "fsdp2", peak_tflops: float = 989.0, mfu: float = 0.4
               ) -> MemoryPlan:
    """The memory plan of ``cfg`` (a ``RunConfig``) on ``gpus`` GPUs of ``gpu_memory_gb`` GB each.

    ``times``: per role, the update's model FLOPs for a worst-case step (every sample at its
    maximum length; 6 N FLOPs per token, 8 N with checkpointing's recomputed forward) and the
    seconds it takes at ``mfu`` of ``peak_tflops`` (dense bf16 per GPU; H100/H200: 989) on the
    role's learner ranks. ``precision``: a name in :data:`PRECISIONS` (the learner's states)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if gpu_memory_gb <= 0:
        raise ValueError(f"--gpu-memory must be > 0 GB, got {gpu_memory_gb}")
    if cfg.model.lora_r:
        raise ValueError(f"the plan counts full fine-tuning (model.lora_r=0, as the paper preset); "
                         f"this configuration trains LoRA adapters (lora_r={cfg.model.lora_r}). "
                         "Give --set model.lora_r=0.")
    gpu_bytes = gpu_memory_gb * GB
    roles: list[RolePlan] = []
    times: dict[str, dict[str, float]] = {}
    for spec in role_specs(cfg, split_gpus(gpus)):
        spec = dataclasses.replace(spec, precision=PRECISIONS[precision])
        eng = engine(spec.shape, spec.gpus_per_engine, gpu_bytes, spec.utilization, spec.max_seq)
        e_fixes: list[str] = []
        if eng["short"] > 0:
            e_fixes.append(f"tensor parallelism over more GPUs per {spec.role} engine: the bf16 "
                           f"weights ({eng['weights'] / GB:.1f} GB) leave no KV cache at "
                           f"gpu_memory_utilization {spec.utilization}")
        elif eng["sequences"] < 1:
            e_fixes.append(f"shorter sequences or tensor parallelism: the KV cache holds "
                           f"{eng['kv_tokens']:.0f} tokens, less than one {spec.max_seq}-token "
                           "sequence")
        roles.append(RolePlan(
            spec.role, "engine", spec.engines, spec.gpus_per_engine, spec.shape.name, eng,
            fits=not e_fixes, fixes=e_fixes,
            notes=[f"gpu_memory_utilization {spec.utilization} (official yaml)",
                   f"{spec.samples_per_update} sequences per step over {spec.engines} engines"]))
        lr = _learner_lines(spec, spec.ranks, checkpointing, spec.token_budget, spec.max_seq)
        ok = lr["total"] <= gpu_bytes
        roles.append(RolePlan(
            spec.role, "learner", spec.ranks, 1, spec.shape.name, lr, fits=ok,
            fixes=[] if ok else _learner_fixes(spec, gpu_bytes, checkpointing),
            notes=[f"micro-batch: {int(lr['tokens'])} tokens ({spec.micro_batch_size} x "
                   f"{spec.max_seq}, budget {spec.token_budget or 'none'}), "
                   f"{int(lr['scored'])} scored"
                   + (f", log-probs in chunks of {spec.logprob_chunk}" if spec.logprob_chunk
                      else ", log-probs of every scored token at once")]))
        tokens = spec.samples_per_update * spec.max_seq
        flops = (8 if checkpointing else 6) * spec.shape.params() * tokens
        if spec.logprob_chunk:  # each chunk's vocabulary projection again in the backward
            flops += 2 * spec.shape.vocab * spec.shape.hidden * tokens
        times[spec.role] = {"tokens": float(tokens), "flops": float(flops),
                            "seconds": flops / (spec.ranks * peak_tflops * 1e12 * mfu),
                            "mfu": mfu, "peak_tflops": peak_tflops}
    return MemoryPlan(gpus, gpu_memory_gb, checkpointing, roles, times, PRECISIONS[precision])


# -- printing ----------------------------------------------------------------------------------
def _learner_rows(p: Precision) -> list[tuple[str, str]]:
    dtype = {2: "bf16", 4: "fp32"}
    rows = [("weights", f"{dtype[p.weight]} weights ({p.weight} B/param)")] if p.weight else []
    rows += [("grads", f"{dtype[p.grad]} grads ({p.grad} B/param)")]
    rows += [("masters", f"fp32 masters ({p.master} B/param)")] if p.master else []
    return rows + [("optimizer", f"AdamW m, v ({p.optimizer} B/param)"),
                   ("fsdp_gather", "FSDP gathered layers (bf16)"),
                   ("activations_no_ckpt", "activations, no checkpointing"),
                   ("activations_ckpt", "activations, checkpointing"),
                   ("logits", "logits of scored tokens"),
                   ("step_temp", "optimizer step temporaries")]


_ENGINE_ROWS = [("weights", "bf16 weights"), ("workspace", "workspace (graphs, prefill)"),
                ("kv_cache", "KV cache")]


def format_plan(plan: MemoryPlan) -> str:
    """The per-GPU table (GB) and the verdict, as ``crl-bench plan`` prints it."""
    cols = [f"{r.role} {r.part}" for r in plan.roles]
    width = max(32, *(len(c) for c in cols))
    head = f"{'per GPU (GB)':<32}" + "".join(f"{c:>{width - 10}}" for c in cols)
    out = [f"{plan.gpus} GPUs x {plan.gpu_memory_gb:g} GB; activation checkpointing "
           f"{'on' if plan.checkpointing else 'off'}; learner states: {plan.precision.name} "
           f"({plan.precision.state_bytes} B/param, sharded over the learner ranks)", "",
           f"{'':<32}" + "".join(f"{f'{r.count} x {r.gpus_each:g} GPU':>{width - 10}}"
                                 for r in plan.roles), head]
    labels = [("learner", k, t) for k, t in _learner_rows(plan.precision)]
    labels += [("engine", k, t) for k, t in _ENGINE_ROWS]
    for part, key, text in labels:
        cells = [f"{r.lines[key] / GB:.1f}" if r.part == part else "" for r in plan.roles]
        out.append(f"{text:<32}" + "".join(f"{c:>{width - 10}}" for c in cells))
    out.append(f"{'total':<32}" + "".join(f"{r.lines['total'] / GB:>{width - 10}.1f}"
                                          for r in plan.roles))
    out.append(f"{'fits':<32}" + "".join(f"{'yes' if r.fits else 'NO':>{width - 10}}"
                                         for r in plan.roles))
    out.append("")
    for r in plan.roles:
        extra = ""
        if r.part == "engine":
            extra = (f"KV cache {r.lines['kv_tokens'] / 1e3:.0f}k tokens = "
                     f"{r.lines['sequences']:.1f} full-length sequences per engine; ")
        out.append(f"{r.role} {r.part} ({r.model}): {extra}{'; '.join(r.notes)}")
    for role, t in plan.times.items():
        out.append(f"{role} update, worst case: {t['tokens'] / 1e6:.2f}M tokens, "
                   f"{t['flops'] / 1e18:.2f} EFLOP, {t['seconds']:.0f} s at MFU {t['mfu']:g} of "
                   f"{t['peak_tflops']:g} TFLOP/s per GPU")
    return "\n".join(out)


def refusal(plan: MemoryPlan) -> str:
    """The error naming every role that does not fit and the changes that would make it fit."""
    parts = []
    for r in plan.roles:
        if not r.fits:
            parts.append(f"{r.role} {r.part} needs {r.lines['total'] / GB:.1f} GB per GPU "
                         f"(> {plan.gpu_memory_gb:g} GB); fixes: " + "; ".join(r.fixes))
    return (f"the plan does not fit {plan.gpus} x {plan.gpu_memory_gb:g} GB GPUs: "
            + " | ".join(parts))


def to_dict(plan: MemoryPlan) -> dict[str, Any]:
    return dataclasses.asdict(plan) | {"fits": plan.fits}
