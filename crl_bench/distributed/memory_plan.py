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

With ``model.placement=colocated`` (the ``paper`` preset, as the official yaml places a role's
training and inference on the same GPUs) every GPU of a role holds an engine's share and a
learner rank, checked in two phases: the rollout (the engine awake beside the rank's resident
states; none with ``model.offload_learner_states``, the default, which keeps them in host memory
then) and the update (the rank's peak beside what a sleeping engine keeps, :data:`SLEEP_KEEPS`).

Activation bytes follow what autograd saves in the transformers implementation of a Qwen2 / Qwen3
decoder layer with SDPA (flash kernel, no dropout); the count is checked against the bytes saved
by a real forward pass (tests/test_memory_plan.py) and against a measured peak
(benchmarks/plan_memory.py). A plan that does not fit is refused, with the changes that would make
it fit (more ranks, checkpointing, a token budget per micro-batch, shorter episodes).

Nothing here imports torch: it is arithmetic on architecture numbers and the run configuration.
"""

from __future__ import annotations

import dataclasses
import math
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
    lora_r: int = 0
    split: dict[str, Any] = field(default_factory=dict)
    """The layout (:func:`split_gpus`)."""
    step: dict[str, Any] = field(default_factory=dict)
    """The estimated time of a worst-case step per part (:func:`estimate_step`)."""

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
    lora_r: int = 0  # 0: full fine-tuning (states sharded); > 0: LoRA adapters of this rank
    sleep: bool = False  # colocated: the engines sleep while the learner ranks update
    offload: bool = False  # colocated, full fine-tuning: the states in host memory in the rollout


PLACEMENTS = ("split", "colocated")
"""``model.placement``: a role's engines and learner ranks on GPUs of their own, or together."""

SLEEP_KEEPS = "workspace"
"""What a sleeping engine still holds on its GPU while the learner updates: vLLM's sleep level 1
"will offload the model weights and discard the KV cache" (the weights are backed up in CPU
memory; docs.vllm.ai/en/latest/features/sleep_mode/), which the official pipeline uses
(ROLL's vLLM strategy, ``sleep_level`` default 1: roll/distributed/strategy/vllm_strategy.py:62;
``offload_states`` resets the prefix cache then sleeps: roll/third_party/vllm/vllm_0_10_2/llm.py:
185-187; verl's hybrid engine likewise). The plan counts the engine's workspace line (CUDA
graphs, allocator pools outside the sleep allocator) as kept: an assumption, not measured."""


def split_gpus(gpus: int, placement: str = "split") -> dict[str, Any]:
    """How ``crl-bench plan`` lays a run on ``gpus`` GPUs (any count >= 1).

    ``placement="colocated"`` (``model.placement``, the ``paper`` preset's, as officially): each
    role's GPUs all hold both its engines and its learner ranks (``<role>_engine_gpus`` =
    ``<role>_ranks`` = the role's GPUs), the engines asleep while the ranks update (``sleep``).
    The rest of this docstring is the ``split`` layout.

    Half the GPUs for each role, the actor taking the odd one (the paper's 16: 8 actor, 8
    extractor; the official yaml maps ``actor_train``/``actor_infer`` to GPUs 0-7 and the memory
    model to 8-15). A role with 2 or more GPUs splits them into generation-engine GPUs and learner
    ranks (half each, the learner taking the odd one: the ``paper16`` Ray plan's 4 + 4); a role
    with one GPU holds its engine and its learner on it (``<role>_colocated``); with one GPU in
    all, both roles share it (``all_colocated``). How many engines the engine GPUs make depends on
    each engine's tensor-parallel size (:func:`role_specs`).

    Returns ``{"actor_engine_gpus", "actor_ranks", "extractor_engine_gpus", "extractor_ranks"}``
    (GPU counts; learner ranks hold one GPU each) and the booleans ``actor_colocated``,
    ``extractor_colocated``, ``all_colocated``.
    """
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"--gpus {gpus}: give the number of GPUs the run has (1 or more)")
    if placement not in PLACEMENTS:
        raise ValueError(f"model.placement={placement!r}: use one of {', '.join(PLACEMENTS)}")
    out: dict[str, Any] = {"all_colocated": gpus == 1, "placement": placement,
                           "sleep": placement == "colocated"}
    shares = {"actor": gpus - gpus // 2 if gpus > 1 else 1, "extractor": gpus // 2 or 1}
    for role, g in shares.items():
        if placement == "colocated":
            out.update({f"{role}_engine_gpus": g, f"{role}_ranks": g, f"{role}_colocated": True,
                        f"{role}_gpus": g})
        elif g == 1:
            out.update({f"{role}_engine_gpus": 1, f"{role}_ranks": 1, f"{role}_colocated": True,
                        f"{role}_gpus": 1})
        else:
            out.update({f"{role}_engine_gpus": g // 2, f"{role}_ranks": g - g // 2,
                        f"{role}_colocated": False, f"{role}_gpus": g})
    return out


def lora_params(shape: ModelShape, r: int) -> int:
    """Parameters of rank-``r`` LoRA adapters on every projection of every layer (the backend's
    targets: q, k, v, o, gate, up, down; ``crl_bench.llm.types.LoraSpec``): ``r x (in + out)``
    each."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    return shape.layers * r * per_layer


def role_specs(cfg: Any, split: dict[str, Any]) -> list[RoleSpec]:
    """The actor's and the extractor's :class:`RoleSpec` from a ``RunConfig`` and a
    :func:`split_gpus` layout: each engine spans ``model.<role>_tensor_parallel`` GPUs (fewer
    when the role has fewer engine GPUs), and takes ``model.<role>_gpu_memory_utilization`` of
    each."""
    actor = model_shape(cfg.model.actor)
    extractor = model_shape(cfg.model.extractor or cfg.model.actor)
    r, a, e, m = cfg.rollout, cfg.actor, cfg.extractor, cfg.model
    episode = r.sequence_length or r.max_episode_tokens
    # trajectory samples: the whole episode, the loss on its assistant turns (bounded by the
    # episode); turn samples: one turn's prompt (up to the episode) + its completion
    actor_scored = episode if a.sample_unit == "trajectory" else r.max_new_tokens
    # the extractor reads the whole trajectory (its text) and writes up to max_new_tokens
    ext_seq = episode + e.max_new_tokens
    episodes = r.groups * r.group_size

    def engines(role: str) -> tuple[int, int]:
        gpus = split[f"{role}_engine_gpus"]
        tp = max(1, min(int(getattr(m, f"{role}_tensor_parallel", 1)), gpus))
        return max(1, gpus // tp), tp

    (a_eng, a_tp), (x_eng, x_tp) = engines("actor"), engines("extractor")
    return [
        RoleSpec("actor", actor, a_eng, a_tp, split["actor_ranks"],
                 a.micro_batch_size, a.micro_batch_tokens, episode, actor_scored,
                 float(getattr(m, "actor_gpu_memory_utilization", 0.85)), episodes,
                 "actor", logprob_chunk=a.logprob_chunk_tokens, sleep=bool(split.get("sleep"))),
        RoleSpec("extractor", extractor, x_eng, x_tp, split["extractor_ranks"],
                 e.micro_batch_size, e.micro_batch_tokens, ext_seq, e.max_new_tokens,
                 float(getattr(m, "extractor_gpu_memory_utilization", 0.7)),
                 e.buffer_size, "extractor", logprob_chunk=e.logprob_chunk_tokens,
                 sleep=bool(split.get("sleep"))),
    ]


def _learner_lines(spec: RoleSpec, ranks: int, checkpointing: bool, budget: int,
                   max_seq: int) -> dict[str, float]:
    tokens = micro_batch_tokens(spec.micro_batch_size, budget, max_seq)
    seqs = max(1, tokens // max_seq)
    scored = min(tokens, seqs * min(spec.scored_per_seq, max_seq))
    if spec.lora_r:
        # LoRA: every rank holds the frozen bf16 base (replicated ranks, gradients all-reduced)
        # and the fp32 adapters with their gradients and AdamW moments (16 B per adapter param)
        lines = learner_rank(spec.shape, 1, tokens, scored, checkpointing=checkpointing,
                             precision=spec.precision, logprob_chunk=spec.logprob_chunk)
        adapters = lora_params(spec.shape, spec.lora_r)
        lines.update(weights=2.0 * spec.shape.params() + 4.0 * adapters, grads=4.0 * adapters,
                     masters=0.0, optimizer=8.0 * adapters, fsdp_gather=0.0,
                     step_temp=4.0 * adapters)
        states = sum(lines[k] for k in ("weights", "grads", "masters", "optimizer"))
        lines["total"] = states + max(lines["activations"] + lines["logits"], lines["step_temp"])
        lines["adapter_params"] = float(adapters)
    else:
        lines = learner_rank(spec.shape, ranks, tokens, scored, checkpointing=checkpointing,
                             precision=spec.precision, logprob_chunk=spec.logprob_chunk)
    return lines | {"tokens": float(tokens), "scored": float(scored)}


def gpus_for_ranks(role: str, ranks: int) -> int:
    """The fewest GPUs whose :func:`split_gpus` gives ``role`` at least ``ranks`` learner ranks."""
    n = 1
    while split_gpus(n)[f"{role}_ranks"] < ranks:
        n += 1
    return n


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
    if not spec.lora_r:
        for ranks in range(spec.ranks + 1, 8 * spec.ranks + 1):
            if fits(ranks=ranks):
                fixes.append(f"{ranks} {spec.role} learner ranks instead of {spec.ranks} (more "
                             f"GPUs: --gpus {gpus_for_ranks(spec.role, ranks)})")
                break
        if spec.lora_r == 0 and _learner_lines(dataclasses.replace(spec, lora_r=16), spec.ranks,
                                               checkpointing, spec.token_budget,
                                               spec.max_seq)["total"] <= gpu_bytes:
            fixes.append("LoRA adapters instead of full fine-tuning (--lora)")
    one_seq = spec.micro_batch_size > 1 and fits(budget=spec.max_seq)
    if one_seq and spec.token_budget != spec.max_seq:
        fixes.append(f"a token budget of one sequence per micro-batch (--set "
                     f"{spec.prefix}.micro_batch_tokens={spec.max_seq})")
    elif one_seq:
        fixes.append(f"a smaller micro-batch (--set {spec.prefix}.micro_batch_size=1)")
    for seq in (32768, 24576, 16384, 12288, 8192, 4096):
        if seq < spec.max_seq and fits(seq=seq, budget=min(spec.token_budget, seq)
                                       if spec.token_budget else 0):
            what = ("rollout.sequence_length and rollout.max_episode_tokens"
                    if spec.prefix == "actor" else "rollout.sequence_length and "
                    "rollout.max_episode_tokens / extractor.max_new_tokens")
            fixes.append(f"sequences of at most {seq} tokens instead of {spec.max_seq} ({what})")
            break
    if not fixes:  # combine: checkpointing and one sequence per micro-batch, then ranks or length
        budget = spec.max_seq if spec.micro_batch_size > 1 else spec.token_budget
        base = dict(ckpt=True, budget=budget)
        combo = ["activation checkpointing"] if not checkpointing else []
        if base["budget"] != spec.token_budget:
            combo.append(f"--set {spec.prefix}.micro_batch_tokens={spec.max_seq}")
        more = (0 if spec.lora_r else
                next((r for r in range(spec.ranks + 1, 8 * spec.ranks + 1) if fits(r, **base)), 0))
        seq = next((q for q in (32768, 24576, 16384, 12288, 8192, 4096, 2048)
                    if q < spec.max_seq and fits(ckpt=True, seq=q, budget=q)), 0)
        if more:
            fixes.append(" + ".join(combo + [f"{more} learner ranks (--gpus "
                                             f"{gpus_for_ranks(spec.role, more)})"]))
        if seq:
            fixes.append(" + ".join([c for c in combo if c == "activation checkpointing"] + [
                f"sequences of at most {seq} tokens (rollout.sequence_length and "
                f"rollout.max_episode_tokens), one per "
                f"micro-batch (--set {spec.prefix}.micro_batch_tokens={seq})"]))
        if not fixes:
            fixes.append("no combination of checkpointing, a token budget, up to 8x the ranks and "
                         "sequences down to 2048 tokens fits: use GPUs with more memory, or more "
                         "GPUs" + ("" if spec.lora_r else ", or LoRA (--lora)"))
        lines = _learner_lines(spec, spec.ranks, True, base["budget"], spec.max_seq)
        if lines["logits"] > 0.25 * gpu_bytes and not spec.logprob_chunk:
            fixes.append(f"(the logits of {int(lines['scored'])} scored tokens alone take "
                         f"{lines['logits'] / GB:.0f} GB per rank: log-probs over chunks of "
                         f"the sequence bound them, --set {spec.prefix}.logprob_chunk_tokens=4096)")
    return fixes


# -- FLOPs and the step-time estimate ----------------------------------------------------------
FLOPS_FORMULA = (
    "FLOPs per token = 2N per forward pass (N: the parameters of the matrix products, i.e. the "
    "decoder layers' projections and the LM head) + 4 L H Q T of attention per forward (scores "
    "and weighted values; L layers, H query heads, Q head size, T the sequence length); a "
    "training token adds a backward of twice the forward (6N + 12 L H Q T: PaLM, Chowdhery et al. "
    "2022, appendix B; the same count as Narayanan et al. 2021, Megatron-LM, eq. 3) and, with "
    "activation checkpointing, one more forward (Megatron's 4 forward-equivalents). LoRA: no "
    "weight gradients of the frozen base, so 4N + 12 L H Q T. Attention is counted over the whole "
    "sequence as PaLM counts it, not halved for the causal mask (an upper bound).")
"""The FLOP count the plan uses, in words (printed by ``crl-bench plan``)."""


def matmul_params(shape: ModelShape) -> int:
    """N of the FLOP count: the weights of the matrix products (each decoder layer's q, k, v, o,
    gate, up, down projections, and the LM head, tied or not); the embedding is a lookup, norms
    and biases are elementwise."""
    h, q, kv = shape.hidden, shape.q_dim, shape.kv_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * shape.intermediate
    return shape.layers * per_layer + shape.vocab * h


def attention_flops(shape: ModelShape, seq: int) -> int:
    """Attention FLOPs of one token in one forward pass over a ``seq``-token sequence:
    ``4 L H Q T`` (QK^T and the weighted sum of V, a multiply-add each; PaLM appendix B)."""
    return 4 * shape.layers * shape.heads * shape.head_dim * seq


def forward_flops_per_token(shape: ModelShape, seq: int) -> int:
    """``2N + 4 L H Q T``: one forward pass (generation, old log-probs, the recompute)."""
    return 2 * matmul_params(shape) + attention_flops(shape, seq)


def train_flops_per_token(shape: ModelShape, seq: int, *, checkpointing: bool = True,
                          lora: bool = False) -> int:
    """Forward + backward (+ the recomputed forward with ``checkpointing``) of one trained token:
    ``6N + 12 L H Q T`` (+ ``2N + 4 L H Q T``); LoRA ``4N + 12 L H Q T`` (+ the same forward)."""
    n, attn = matmul_params(shape), attention_flops(shape, seq)
    flops = (4 if lora else 6) * n + 3 * attn
    return flops + (2 * n + attn if checkpointing else 0)


@dataclass(frozen=True)
class Hardware:
    """The figures the step-time estimate assumes (``crl-bench plan`` options)."""

    peak_tflops: float = 989.0
    """Dense bf16 TFLOP/s of one GPU (H100/H200 SXM: 989)."""
    mfu: float = 0.4
    """The share of the peak that compute-bound parts reach."""
    hbm_tbps: float = 3.35
    """HBM bandwidth of one GPU in TB/s (H100 SXM: 3.35; H200: 4.8)."""
    sync_gbps: float = 50.0
    """GB/s at which updated weights reach the engines (an NCCL broadcast inside a node)."""
    host_gbps: float = 25.0
    """GB/s between a GPU and host memory (a sleeping engine's weights go out and come back;
    PCIe 4.0 x16 is 32 GB/s in theory): an assumption."""


def _part(name: str, flops: float, gpus: float, hw: Hardware, *, memory_s: float = 0.0,
          what: str = "") -> dict[str, Any]:
    compute_s = flops / (gpus * hw.peak_tflops * 1e12 * hw.mfu) if flops else 0.0
    return {"part": name, "flops": float(flops), "gpus": float(gpus), "compute_s": compute_s,
            "memory_s": memory_s, "seconds": max(compute_s, memory_s),
            "bound": "memory bandwidth" if memory_s > compute_s else "compute", "what": what}


def _generation(role: str, spec: RoleSpec, sequences: int, seq: int, new_tokens: int,
                kv_tokens: float, hw: Hardware) -> dict[str, Any]:
    """Generating ``sequences`` of ``seq`` tokens (``new_tokens`` of them decoded) on the role's
    engines: compute ``seq x (2N + 4 L H Q T)`` per sequence; bandwidth: each decode step of an
    engine reads its weights once and the KV cache of the sequences it runs (half full on
    average), and an engine runs as many sequences at once as its KV cache holds."""
    shape = spec.shape
    flops = sequences * seq * forward_flops_per_token(shape, seq)
    per_engine = math.ceil(sequences / spec.engines)
    at_once = max(1, min(per_engine, int(kv_tokens // seq)))
    waves = math.ceil(per_engine / at_once)
    step_bytes = 2 * shape.params() + at_once * (seq / 2) * shape.kv_bytes_per_token(2)
    memory_s = waves * new_tokens * step_bytes / (spec.gpus_per_engine * hw.hbm_tbps * 1e12)
    return _part(f"{role} generation", flops, spec.engines * spec.gpus_per_engine, hw,
                 memory_s=memory_s,
                 what=f"{sequences} sequences of {seq} tokens, {new_tokens} decoded; "
                      f"{at_once} at once per engine ({waves} wave{'s' if waves > 1 else ''})")


def _sleep_part(role: str, spec: RoleSpec, hw: Hardware, times: float = 1.0) -> dict[str, Any]:
    """A colocated role's engines going to sleep before the update and waking after it: each
    GPU's share of the bf16 weights to host memory and back (all GPUs at once), ``times`` per
    step."""
    per_gpu = 2 * spec.shape.params() / spec.gpus_per_engine
    return _part(f"{role} sleep + wake", 0, 1, hw,
                 memory_s=times * 2 * per_gpu / (hw.host_gbps * 1e9),
                 what=f"{per_gpu / GB:.1f} GB of weights per GPU to host memory and back"
                      + (f", {times:.2f} times per step" if times != 1.0 else ""))


def estimate_step(cfg: Any, specs: list[RoleSpec], engines: dict[str, dict[str, float]],
                  checkpointing: bool, hw: Hardware, shared: bool) -> dict[str, Any]:
    """Seconds per part of one worst-case step (every episode at its longest): actor rollout
    generation, old log-probs, actor update, weight sync; extractor generation, update, sync.
    An estimate from :data:`FLOPS_FORMULA`, the :class:`Hardware` figures and the plan's KV
    cache, not a measurement."""
    r, lora = cfg.rollout, bool(cfg.model.lora_r)
    actor, ext = specs
    seq = actor.max_seq
    episodes = r.groups * r.group_size
    decoded = min(r.max_episode_tokens, seq)  # worst case: the episode all generated
    parts = [_generation("actor", actor, episodes, seq, decoded, engines["actor"]["kv_tokens"], hw)]
    tokens = episodes * seq
    if cfg.actor.recompute_old_logprobs:
        parts.append(_part("actor old log-probs", tokens * forward_flops_per_token(actor.shape, seq),
                           actor.ranks, hw, what=f"{tokens / 1e6:.2f}M tokens, one forward"))
    flops = tokens * train_flops_per_token(actor.shape, seq, checkpointing=checkpointing, lora=lora)
    if actor.logprob_chunk:  # each chunk's vocabulary projection again in the backward
        flops += 2 * actor.shape.vocab * actor.shape.hidden * tokens
    parts.append(_part("actor update", flops, actor.ranks, hw,
                       what=f"{tokens / 1e6:.2f}M tokens, forward + backward"
                            + (" + recompute" if checkpointing else "")))
    sync_bytes = (2 * lora_params(actor.shape, cfg.model.lora_r) if lora
                  else 2 * actor.shape.params())
    parts.append(_part("actor weight sync", 0, 1, hw, memory_s=sync_bytes / (hw.sync_gbps * 1e9),
                       what=f"{sync_bytes / GB:.2f} GB of bf16 "
                            f"{'adapters' if lora else 'weights'} into the engines"))
    if actor.sleep:
        parts.append(_sleep_part("actor", actor, hw))
    for p in parts:
        p["role"] = "actor"
    # the extractor: one extraction per distilled episode of the step, its update amortised
    distilled = episodes // 2 if cfg.extractor.distill == "with_experience" else episodes
    x_seq = ext.max_seq
    x_parts = [_generation("extractor", ext, distilled, x_seq, cfg.extractor.max_new_tokens,
                           engines["extractor"]["kv_tokens"], hw)]
    x_tokens = distilled * x_seq
    if cfg.extractor.recompute_old_logprobs:
        x_parts.append(_part("extractor old log-probs",
                             x_tokens * forward_flops_per_token(ext.shape, x_seq), ext.ranks, hw,
                             what=f"{x_tokens / 1e6:.2f}M tokens, one forward"))
    x_flops = x_tokens * train_flops_per_token(ext.shape, x_seq, checkpointing=checkpointing,
                                               lora=lora)
    if ext.logprob_chunk:
        x_flops += 2 * ext.shape.vocab * ext.shape.hidden * x_tokens
    x_parts.append(_part("extractor update", x_flops, ext.ranks, hw,
                         what=f"{distilled} extractions per step ({x_tokens / 1e6:.2f}M tokens); "
                              f"updates of {ext.samples_per_update} samples, amortised"))
    pushes = distilled / max(1, ext.samples_per_update)
    x_sync = pushes * (2 * lora_params(ext.shape, cfg.model.lora_r) if lora
                       else 2 * ext.shape.params())
    x_parts.append(_part("extractor weight sync", 0, 1, hw,
                         memory_s=x_sync / (hw.sync_gbps * 1e9),
                         what=f"{pushes:.2f} pushes per step"))
    if ext.sleep:
        x_parts.append(_sleep_part("extractor", ext, hw, times=pushes))
    for p in x_parts:
        p["role"] = "extractor"
    actor_s = sum(p["seconds"] for p in parts)
    ext_s = sum(p["seconds"] for p in x_parts)
    # on GPUs of their own the extractor's work overlaps the actor's (the actor waits for its
    # backlog before each rollout); on shared GPUs the two take turns
    step = actor_s + ext_s if shared else max(actor_s, ext_s)
    return {"parts": [*parts, *x_parts], "actor_s": actor_s, "extractor_s": ext_s,
            "step_s": step, "steps": cfg.steps, "run_h": step * cfg.steps / 3600,
            "shared": shared, "hardware": dataclasses.asdict(hw), "formula": FLOPS_FORMULA}


def _colocated_check(names: list[str], specs: dict[str, RoleSpec],
                     engines: dict[str, dict[str, float]], learners: dict[str, dict[str, float]],
                     gpu_bytes: float, gpu_memory_gb: float, lora_r: int,
                     notes: dict[str, str], fixes: dict[str, list[str]],
                     update_fixes: dict[str, list[str]]) -> None:
    """The two phases of GPUs shared by engines that sleep and learner ranks (``names``: the
    roles on them): rollout = the engines' ``gpu_memory_utilization`` + the ranks' resident
    states (none when offloaded, :func:`rollout_resident`); update = the ranks' peaks + what the
    sleeping engines keep."""
    rollout = sum(specs[n].utilization * gpu_bytes + rollout_resident(specs[n], learners[n])
                  for n in names)
    kept = sum(engines[n][SLEEP_KEEPS] for n in names)
    # the roles update one at a time; the others' states stay where they are in the rollout
    update = kept + max(learners[n]["total"] + sum(rollout_resident(specs[o], learners[o])
                                                   for o in names if o != n) for n in names)
    resident = sum(rollout_resident(specs[n], learners[n]) for n in names)
    host = sum(learner_resident(learners[n]) for n in names if specs[n].offload)
    where = ("both roles share each GPU" if len(names) > 1 else
             f"each {names[0]} GPU holds an engine's share and a learner rank")
    states = (f"learner states {resident / GB:.1f}" if not host else
              f"learner states in host memory: {host / GB:.1f} GB per rank of fp32 masters "
              "and AdamW moments, offloaded after each push, reloaded for the update")
    for n in names:
        notes[n] = (f"{where}: rollout {rollout / GB:.1f} GB of {gpu_memory_gb:g} (engine "
                    f"{specs[n].utilization:g} of the GPU + {states}), "
                    f"update {update / GB:.1f} GB (learner + {kept / GB:.1f} kept by the "
                    "sleeping engine); the engines sleep during the update (vLLM sleep level 1, "
                    "weights to host memory, KV cache dropped)")
    problems, late = [], []
    if rollout > gpu_bytes:
        sets, util = _colocation_fix(names, specs, resident, gpu_bytes)
        ok = all(engine(specs[n].shape, specs[n].gpus_per_engine, gpu_bytes, util[n],
                        specs[n].max_seq)["sequences"] >= 1 for n in names)
        problems.append(f"lower the engines' share of the GPU so the learner's resident states "
                        f"fit beside them during the rollout ({' '.join(sets)})" if ok else
                        "the learners' resident states leave the engines too little memory for "
                        "one full-length sequence: more GPUs" + ("" if lora_r else
                                                                  ", or LoRA (--lora)"))
    if update > gpu_bytes:
        late.append(f"the update needs {update / GB:.1f} GB beside the sleeping engine: more "
                    "GPUs (more ranks), or --set model.placement=split")
    for n in names:
        if problems:  # the rollout: engines and learners both
            fixes[n] = problems
        if late:  # the update: the learners'
            update_fixes[n] = late


def _colocation_fix(role_names: list[str], specs: dict[str, RoleSpec], learners: float,
                    gpu_bytes: float) -> tuple[list[str], dict[str, float]]:
    """Utilizations that leave the learners on the same GPU their memory: the engines share what
    the learners leave, in proportion to their configured utilization."""
    left = max(0.0, 1.0 - learners / gpu_bytes - 0.02)
    total = sum(specs[n].utilization for n in role_names)
    util = {n: round(math.floor(100 * left * specs[n].utilization / total) / 100, 2)
            for n in role_names}
    return [f"--set model.{n}_gpu_memory_utilization={util[n]:g}" for n in role_names], util


def placement_of(cfg: Any) -> str:
    """``model.placement`` of a ``RunConfig`` ("split" when the config has none)."""
    return str(getattr(cfg.model, "placement", "split"))


def rollout_resident(spec: RoleSpec, lines: dict[str, float]) -> float:
    """What a learner rank keeps on a colocated GPU while the engine rolls out: nothing when
    its states are offloaded to host memory (``spec.offload``, ``model.offload_learner_states``:
    the official pipeline's ``offload_states`` before each rollout, roll/pipeline/agentic/
    agentic_pipeline.py:193, moves them all, roll/distributed/strategy/megatron_strategy.py:537),
    else :func:`learner_resident`."""
    return 0.0 if spec.offload else learner_resident(lines)


def learner_resident(lines: dict[str, float]) -> float:
    """What a learner rank keeps on its GPU between updates (while a colocated engine rolls
    out): its weights, fp32 masters and AdamW moments; the gradients are freed after each step
    (``zero_grad(set_to_none=True)``, crl_bench/training/role_trainer.py)."""
    return lines["weights"] + lines["masters"] + lines["optimizer"]


def build_plan(cfg: Any, gpus: int, gpu_memory_gb: float, *, checkpointing: bool = True,
               precision: str = "fsdp2", peak_tflops: float = 989.0, mfu: float = 0.4,
               hbm_tbps: float = 3.35, sync_gbps: float = 50.0,
               host_gbps: float = 25.0) -> MemoryPlan:
    """The memory plan of ``cfg`` (a ``RunConfig``) on ``gpus`` GPUs of ``gpu_memory_gb`` GB each,
    laid out by :func:`split_gpus`, and the estimated time of a worst-case step per part
    (:func:`estimate_step`, from :data:`FLOPS_FORMULA` at ``mfu`` of ``peak_tflops`` and decode at
    ``hbm_tbps``).

    Full fine-tuning (``model.lora_r=0``) shards each role's states over its learner ranks
    (``precision``: a name in :data:`PRECISIONS`); LoRA (``lora_r > 0``) replicates the frozen
    bf16 base on every rank beside fp32 adapters. Where an engine shares its GPU with a learner
    (one GPU for a role, or for the run), vLLM takes ``model.<role>_gpu_memory_utilization`` of
    it and the learner must fit in the rest.

    ``model.placement=colocated``: every GPU of a role holds an engine's share and a learner
    rank, in two phases: the rollout (the engine at its ``gpu_memory_utilization`` beside the
    rank's resident states, :func:`learner_resident`) and the update (the rank's whole peak
    beside the sleeping engine's :data:`SLEEP_KEEPS` line); both must fit."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if gpu_memory_gb <= 0:
        raise ValueError(f"--gpu-memory must be > 0 GB, got {gpu_memory_gb}")
    gpu_bytes = gpu_memory_gb * GB
    split = split_gpus(gpus, placement_of(cfg))
    sleep = bool(split["sleep"])
    roles: list[RolePlan] = []
    times: dict[str, dict[str, float]] = {}
    offload = (sleep and not cfg.model.lora_r
               and bool(getattr(cfg.model, "offload_learner_states", True)))
    specs = {s.role: dataclasses.replace(s, precision=PRECISIONS[precision],
                                         lora_r=cfg.model.lora_r, offload=offload)
             for s in role_specs(cfg, split)}
    engines: dict[str, dict[str, float]] = {}
    learners: dict[str, dict[str, float]] = {}
    for spec in specs.values():
        engines[spec.role] = engine(spec.shape, spec.gpus_per_engine, gpu_bytes, spec.utilization,
                                    spec.max_seq)
        learners[spec.role] = _learner_lines(spec, spec.ranks, checkpointing, spec.token_budget,
                                             spec.max_seq)
    # GPUs that hold several parts: their sum must fit
    groups: list[list[str]] = []
    if split["all_colocated"]:
        groups.append(["actor", "extractor"])
    else:
        groups += [[n] for n in ("actor", "extractor") if split[f"{n}_colocated"]]
    shared_fixes: dict[str, list[str]] = {}
    update_fixes: dict[str, list[str]] = {}
    shared_notes: dict[str, str] = {}
    for names in groups:
        if sleep:
            _colocated_check(names, specs, engines, learners, gpu_bytes, gpu_memory_gb,
                             cfg.model.lora_r, shared_notes, shared_fixes, update_fixes)
            continue
        used = sum(specs[n].utilization * gpu_bytes for n in names)
        learn = sum(learners[n]["total"] for n in names)
        where = ("both roles' engines and learners share each GPU" if len(names) > 1 else
                 f"the {names[0]} engine and learner share its GPU")
        for n in names:
            shared_notes[n] = (f"{where}: {(used + learn) / GB:.1f} GB of "
                               f"{gpu_memory_gb:g} (engines {used / GB:.1f} = their "
                               f"gpu_memory_utilization, learners {learn / GB:.1f})")
        if used + learn > gpu_bytes:
            sets, util = _colocation_fix(names, specs, learn, gpu_bytes)
            ok = all(engine(specs[n].shape, specs[n].gpus_per_engine, gpu_bytes, util[n],
                            specs[n].max_seq)["sequences"] >= 1 for n in names)
            fix = (f"lower the engines' share of the GPU so the learner fits beside them "
                   f"({' '.join(sets)})" if ok else
                   "the learners leave the engines too little memory for one full-length "
                   "sequence: more GPUs" + ("" if cfg.model.lora_r else ", or LoRA (--lora)"))
            for n in names:
                shared_fixes[n] = [fix]
    for spec in specs.values():
        eng = engines[spec.role]
        e_fixes: list[str] = list(shared_fixes.get(spec.role, []))
        if eng["short"] > 0:
            e_fixes.append(f"tensor parallelism over more GPUs per {spec.role} engine: the bf16 "
                           f"weights ({eng['weights'] / GB:.1f} GB) leave no KV cache at "
                           f"gpu_memory_utilization {spec.utilization}")
        elif eng["sequences"] < 1:
            e_fixes.append(f"shorter sequences or tensor parallelism: the KV cache holds "
                           f"{eng['kv_tokens']:.0f} tokens, less than one {spec.max_seq}-token "
                           "sequence")
        tp_wanted = int(getattr(cfg.model, f"{spec.role}_tensor_parallel", 1))
        notes = [f"gpu_memory_utilization {spec.utilization:g}",
                 f"{spec.samples_per_update} sequences per "
                 f"{'step' if spec.role == 'actor' else 'update'} over {spec.engines} "
                 f"engine{'s' if spec.engines > 1 else ''}"]
        if spec.gpus_per_engine < tp_wanted:
            notes.append(f"tensor parallel {spec.gpus_per_engine:g} instead of the configured "
                         f"{tp_wanted}: the role has {split[f'{spec.role}_engine_gpus']} engine "
                         "GPU(s)")
        if spec.role in shared_notes:
            notes.append(shared_notes[spec.role])
        roles.append(RolePlan(spec.role, "engine", spec.engines, spec.gpus_per_engine,
                              spec.shape.name, eng, fits=not e_fixes, fixes=e_fixes, notes=notes))
        lr = learners[spec.role]
        ok = (lr["total"] <= gpu_bytes and not shared_fixes.get(spec.role)
              and not update_fixes.get(spec.role))
        fixes = ([] if lr["total"] <= gpu_bytes else _learner_fixes(spec, gpu_bytes, checkpointing))
        fixes += shared_fixes.get(spec.role, []) + update_fixes.get(spec.role, [])
        states = (f"LoRA r={spec.lora_r}: frozen bf16 base on every rank, "
                  f"{lr['adapter_params'] / 1e6:.1f}M fp32 adapter parameters"
                  if spec.lora_r else f"states sharded over {spec.ranks} rank(s)")
        roles.append(RolePlan(
            spec.role, "learner", spec.ranks, 1, spec.shape.name, lr, fits=ok, fixes=fixes,
            notes=[*([shared_notes[spec.role]] if spec.role in shared_notes else []),
                   states, f"micro-batch: {int(lr['tokens'])} tokens ({spec.micro_batch_size} x "
                   f"{spec.max_seq}, budget {spec.token_budget or 'none'}), "
                   f"{int(lr['scored'])} scored"
                   + (f", log-probs in chunks of {spec.logprob_chunk}" if spec.logprob_chunk
                      else ", log-probs of every scored token at once")]))
    hw = Hardware(peak_tflops, mfu, hbm_tbps, sync_gbps, host_gbps)
    step = estimate_step(cfg, [specs["actor"], specs["extractor"]], engines, checkpointing, hw,
                         shared=split["all_colocated"])
    for p in step["parts"]:
        if p["part"].endswith("update"):
            spec = specs[p["role"]]
            times[p["role"]] = {"tokens": float(spec.samples_per_update * spec.max_seq),
                                "flops": p["flops"], "seconds": p["seconds"], "mfu": mfu,
                                "peak_tflops": peak_tflops}
    return MemoryPlan(gpus, gpu_memory_gb, checkpointing, roles, times, PRECISIONS[precision],
                      lora_r=cfg.model.lora_r, split=split, step=step)


# -- printing ----------------------------------------------------------------------------------
def _learner_rows(p: Precision, lora: bool = False) -> list[tuple[str, str]]:
    dtype = {2: "bf16", 4: "fp32"}
    if lora:
        rows = [("weights", "bf16 base (2 B/param) + fp32 adapters"),
                ("grads", "adapter grads (fp32)"), ("optimizer", "AdamW m, v (adapters)")]
    else:
        rows = [("weights", f"{dtype[p.weight]} weights ({p.weight} B/param)")] if p.weight else []
        rows += [("grads", f"{dtype[p.grad]} grads ({p.grad} B/param)")]
        rows += [("masters", f"fp32 masters ({p.master} B/param)")] if p.master else []
        rows += [("optimizer", f"AdamW m, v ({p.optimizer} B/param)"),
                 ("fsdp_gather", "FSDP gathered layers (bf16)")]
    return rows + [("activations_no_ckpt", "activations, no checkpointing"),
                   ("activations_ckpt", "activations, checkpointing"),
                   ("logits", "logits of scored tokens"),
                   ("step_temp", "optimizer step temporaries")]


_ENGINE_ROWS = [("weights", "bf16 weights"), ("workspace", "workspace (graphs, prefill)"),
                ("kv_cache", "KV cache")]


def layout_text(plan: MemoryPlan) -> str:
    """Where each part runs, in one line per role."""
    s = plan.split
    out = []
    by = {(r.role, r.part): r for r in plan.roles}
    for role in ("actor", "extractor"):
        e, l = by[role, "engine"], by[role, "learner"]
        eng = f"{e.count} vLLM engine{'s' if e.count > 1 else ''} x {e.gpus_each:g} GPU"
        lrn = f"{l.count} learner rank{'s' if l.count > 1 else ''} x 1 GPU"
        if s.get("all_colocated"):
            where = "on the run's one GPU, shared with the other role"
        elif s.get("sleep"):
            where = (f"together on {s[f'{role}_gpus']} GPUs of its own (colocated: each GPU "
                     "holds an engine's share and a rank; the engines sleep while the ranks "
                     "update)")
        elif s.get(f"{role}_colocated"):
            where = "sharing one GPU"
        else:
            where = f"on {s[f'{role}_engine_gpus'] + s[f'{role}_ranks']} GPUs of its own"
        out.append(f"{role}: {eng} + {lrn}, {where}")
    return "; ".join(out)


def format_plan(plan: MemoryPlan) -> str:
    """The per-GPU table (GB), the estimated step time per part, and the verdict, as
    ``crl-bench plan`` prints it."""
    cols = [f"{r.role} {r.part}" for r in plan.roles]
    width = max(32, *(len(c) for c in cols))
    head = f"{'per GPU (GB)':<32}" + "".join(f"{c:>{width - 10}}" for c in cols)
    training = (f"LoRA adapters (r={plan.lora_r}) on frozen bf16 bases" if plan.lora_r else
                f"full fine-tuning, learner states {plan.precision.name} "
                f"({plan.precision.state_bytes} B/param, sharded over the learner ranks)")
    out = [f"{plan.gpus} GPU{'s' if plan.gpus > 1 else ''} x {plan.gpu_memory_gb:g} GB; "
           f"activation checkpointing {'on' if plan.checkpointing else 'off'}; {training}",
           f"layout: {layout_text(plan)}", "",
           f"{'':<32}" + "".join(f"{f'{r.count} x {r.gpus_each:g} GPU':>{width - 10}}"
                                 for r in plan.roles), head]
    labels = [("learner", k, t) for k, t in _learner_rows(plan.precision, bool(plan.lora_r))]
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
    if plan.step:
        out += ["", *format_step(plan.step)]
    return "\n".join(out)


def format_step(step: dict[str, Any]) -> list[str]:
    """The step-time estimate per part (seconds), with what it assumes."""
    hw = step["hardware"]
    out = [f"Estimated time of a worst-case step (every episode at its longest), per part - an "
           f"estimate from FLOPs at MFU {hw['mfu']:g} of {hw['peak_tflops']:g} TFLOP/s per GPU, "
           f"decoding at {hw['hbm_tbps']:g} TB/s of HBM, weights synced at "
           f"{hw['sync_gbps']:g} GB/s; not a measurement:",
           f"  {'part':<26}{'TFLOP':>12}{'GPUs':>6}{'seconds':>10}  bound by / what"]
    for p in step["parts"]:
        out.append(f"  {p['part']:<26}{p['flops'] / 1e12:>12,.0f}{p['gpus']:>6g}"
                   f"{p['seconds']:>10,.1f}  {p['bound'] if p['flops'] else 'transfer'}; "
                   f"{p['what']}")
    how = ("the roles share the GPUs: actor + extractor" if step["shared"] else
           "the extractor runs on its own GPUs beside the actor: max(actor, extractor)")
    out.append(f"  step: actor {step['actor_s']:,.0f} s, extractor {step['extractor_s']:,.0f} s; "
               f"{how} = {step['step_s']:,.0f} s; {step['steps']} steps = "
               f"{step['run_h']:,.1f} h")
    out.append(f"  {step['formula']}")
    return out


def refusal(plan: MemoryPlan) -> str:
    """The error naming every role that does not fit and the changes that would make it fit."""
    parts = []
    for r in plan.roles:
        if not r.fits:
            shared = next((n for n in r.notes if "share" in n and " GB of " in n), None)
            need = (f"shares its GPU ({shared.split(': ', 1)[1]})" if shared else
                    f"needs {r.lines['total'] / GB:.1f} GB per GPU (> {plan.gpu_memory_gb:g} GB)")
            parts.append(f"{r.role} {r.part} {need}; fixes: " + "; ".join(dict.fromkeys(r.fixes)))
    return (f"the plan does not fit {plan.gpus} x {plan.gpu_memory_gb:g} GB GPUs: "
            + " | ".join(parts))


def to_dict(plan: MemoryPlan) -> dict[str, Any]:
    return dataclasses.asdict(plan) | {"fits": plan.fits}
