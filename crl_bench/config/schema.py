"""Typed run configuration, presets and ``--set key=value`` overrides.

A run is described by one :class:`RunConfig` (nested dataclasses); ``RunConfig()`` is the base.
A preset is a short list of changes to that base (:data:`PRESETS`, the one table that the
``--preset`` choices, ``crl-bench list presets`` and the docs read):

* ``tiny`` — a tiny model (``tiny-sft``: 2 layers, SmolLM2's tokenizer, taught the answer formats
  by a few hundred supervised steps when first built); for tests and CI (a run takes
  well under a minute or two on 2 CPU cores). Numbers from it mean nothing.
* ``quick`` — ``cpu`` cut down so that the main command (``crl-bench run --agent comp_rl --tasks
  3mix``) ends in under 15 minutes on 2 idle CPU cores (2 steps, 2 held-out episodes per task
  and mode at the end); the default without a GPU. A look at the pipeline, not a result.
* ``cpu`` — the embedded SmolLM2-135M-Instruct and MiniLM embedder, small groups and short
  episodes. Measured on 2 CPU cores, two runs side by side with one thread each: 10 MiniHack
  steps plus 3 evaluations took 68 min for ``grpo``; a ``comp_rl`` step took about 7 min while
  the extractor shared the actor's model (it now runs in a process of its own,
  ``extractor.runs=process``); ``3mix`` plays three families and takes several hours.
* ``paper`` — the paper's configuration for GPUs (Qwen2.5-7B-Instruct actor, Qwen3-4B-Thinking
  extractor, K=8, 16 task groups, 512 steps, lr 1e-6, clip 0.2, CISPO 0.1/0.1, ...). It needs
  CUDA and the models from the hub and fails early, with the reason, where they are missing.

``--set section.field=value`` overrides any field (``--set actor.lr=2e-5``); values are parsed as
JSON where possible. :meth:`RunConfig.validate` checks every field's type and range (see
:data:`crl_bench.config.validation.FIELD_RANGES`) and every name against its registry *before anything is built*; a bad value
raises :class:`ConfigError` naming the field and the fix. Documented limits: at most
:data:`~crl_bench.config.validation.MAX_GROUP_SIZE` rollouts per group and :data:`~crl_bench.config.validation.MAX_EPISODES_PER_STEP` episodes per step
(``rollout.groups * rollout.group_size``) or per evaluated task (``eval.episodes_per_task``): every
episode holds a live env and its prompts, so larger values exhaust memory before they do anything
useful. ``eval.episodes_per_task`` must be >= 1 (there is no "no evaluation" setting: use
``eval.every=0`` and ``eval.at_start=false`` for a single evaluation at the end).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar, Literal

from crl_bench.algorithms import Aggregation
from crl_bench.config.errors import ConfigError  # raised by the config and its validation
from crl_bench.experience.retrieval import RetrievalSettings

DEFAULT_AGENT = "comp_rl"
"""The agent of a run that names none (``RunConfig()``, ``crl-bench run``, ``run_experiment``)."""
DEFAULT_TASKS = "3mix"
"""The task set of a run that names none."""

# The choices of string-valued settings: validation reads the allowed values from these types.
Dtype = Literal["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"]
Conversation = Literal["window", "full"]
ExamplePick = Literal["first", "random", "none", "placeholder"]
Schedule = Literal["constant", "cosine"]
SampleUnit = Literal["turn", "trajectory"]
Distill = Literal["all", "with_experience"]
SamplePolicy = Literal["pool", "buffer"]
UpdateMode = Literal["in_place", "replace"]
ExtractionStyle = Literal["short", "official"]
MergeFormat = Literal["items", "ops"]
Placement = Literal["split", "colocated"]
MergeStyle = Literal["ours", "official"]
Fence = Literal["always", "official"]
AnswerTemplate = Literal["free", "content", "sentence", "action"]
RetrievalKey = Literal["entry", "episode_start"]
MergeScope = Literal["family", "key"]
AskOffer = Literal["with_experience", "all"]
AskStyle = Literal["short", "official"]
AskAnswerRole = Literal["auto", "user", "tool"]
AskTag = Literal["ask", "knowledge_search_and_ask"]
Query = Literal["goal_observation", "family"]
EvalModes = Literal["both", "with_experience"]
ExtractorRuns = Literal["inline", "thread", "process"]
PromptLayout = Literal["ours", "official"]
ExperiencePlace = Literal["user", "system"]

DEPRECATED: dict[str, str] = {
    "experience.warmup_steps": "experience.bank_fill_steps",
    "method.gate": "experience.gate",
    "extractor.asynchronous": "extractor.runs",
}
"""Old setting name -> its new name. An old name is refused, naming the new one, wherever a
setting is given: ``--set``, a stored ``config.json`` (rename the key there to resume an old run),
the Python API (a section's constructor or attribute). A name is looked up here only once it is no
longer a field."""


ALIASES: dict[str, str] = {f"experience.{name}": f"retrieval.{name}" for name in (
    "k", "oversample", "lam", "recent_s", "drop_recent_top1_p", "usage_per")}
"""Old spelling -> the setting's name now, both accepted where a setting is given by name:
``--set``, a preset's changes, a stored ``config.json`` (the retrieval settings were fields of
``experience``; they are one section now, handed to the experience manager whole). From Python
the attribute is the new one (``cfg.retrieval.k``)."""


def canonical_key(key: str) -> str:
    """``key`` under its name now (:data:`ALIASES`)."""
    return ALIASES.get(key, key)


def refuse_deprecated(key: str) -> None:
    """Raise :class:`ConfigError` when ``key`` (dotted, ``--set`` spelling) is an old name."""
    if key in ALIASES:  # reached from Python only: names given as text are translated
        raise ConfigError(f"{key} is {ALIASES[key]} now: use cfg.{ALIASES[key]} (in --set and "
                          "a stored config.json either spelling works).")
    new = DEPRECATED.get(key)
    if new is not None:
        raise ConfigError(f"{key} was renamed {new}: use {new} instead (in --set, in Python, or "
                          "as the key in a stored config.json, which is how an old run resumes).")


class _Section:
    """A config section refuses an attribute that is not one of its fields (a typo or an old name
    set from Python would otherwise be ignored, silently)."""

    _section_name: ClassVar[str] = ""

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            key = f"{self._section_name}.{name}" if self._section_name else name
            refuse_deprecated(key)
            from crl_bench.registry import did_you_mean

            raise ConfigError(f"{key}: no such setting. Settings here: "
                              f"{', '.join(sorted(self.__dataclass_fields__))}."  # type: ignore[attr-defined]
                              f"{did_you_mean(name, self.__dataclass_fields__)}")  # type: ignore[attr-defined]
        object.__setattr__(self, name, value)


def _section(name: str) -> Callable[[type], type]:
    """Mark a dataclass as the config section ``name``: an old keyword in its constructor is
    refused naming the new one (``ExperienceConfig(warmup_steps=1)``)."""
    def wrap(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for key in kwargs:
                if key not in cls.__dataclass_fields__:  # type: ignore[attr-defined]
                    refuse_deprecated(f"{name}.{key}" if name else key)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        cls._section_name = name  # type: ignore[attr-defined]
        return cls
    return wrap


@_section("model")
@dataclass
class ModelConfig(_Section):
    actor: str = "smollm2-135m"
    """Model name for the actor: a short name (smollm2-135m, tiny-random), a hub id or a path."""
    extractor: str | None = None
    """Separate base model for the extractor (None: the extractor is a LoRA adapter on the actor's
    base model — separate parameters, one copy of the base in memory)."""
    backend: str = "hf"
    """Generation backend, a name in ``crl_bench.llm.backend.BACKENDS``: "hf" (transformers; CPU or
    GPU) or "vllm" (GPU)."""
    dtype: Dtype = "auto"
    device: str = "auto"
    lora_r: int = 16
    """LoRA rank; 0 = full fine-tuning (every parameter of each role's model trains, as the
    official runs do; with the ``vllm`` backend each model's updated weights are pushed into its
    engine in place, docs/vllm.md)."""
    lora_alpha: int = 32
    max_batch_size: int = 64
    """``hf`` backend: rows per generation / log-prob chunk. Bounds the KV cache: SmolLM2-135M
    holds ~46 KB of fp32 KV per token, so 64 rows of ~500-token prompts are ~1.5 GB, twice that
    while a decode step copies it. Lower it when several runs share one machine's memory (vLLM
    schedules its own batches and ignores it). Greedy decoding gives the same tokens in any
    chunking; sampling draws its random numbers chunk by chunk, so a run with another value
    samples other (equally distributed) tokens from the same seed: measured, the `grpo` seed-1
    step-0 evaluation of results/learning_minihack solves 4/64 levels at 64 rows, 3/64 at 16."""
    actor_gpu_memory_utilization: float = 0.85
    """``vllm`` backend: the fraction of its GPU memory the actor's engine takes (weights, then
    KV cache in the rest; official ``actor_infer`` 0.85)."""
    extractor_gpu_memory_utilization: float = 0.7
    """``vllm`` backend: the same for the extractor's engine (official ``memory_model`` 0.7)."""
    actor_max_model_len: int = 0
    """``vllm`` backend: the longest prompt + completion the actor's engine holds; 0: the longest
    episode (``rollout.max_episode_tokens``). Shorter than an episode, vLLM refuses its prompts."""
    extractor_max_model_len: int = 0
    """The same for the extractor's engine; 0: an episode plus the extractor's answer
    (``rollout.max_episode_tokens + extractor.max_new_tokens``; official 65,536)."""
    actor_tensor_parallel: int = 1
    """``vllm`` backend: GPUs of one actor engine (tensor parallel; official: 1 per engine)."""
    extractor_tensor_parallel: int = 1
    """GPUs of one extractor engine (official ``memory_model`` ``tensor_parallel_size`` 4)."""
    placement: Placement = "split"
    """Where a role's vLLM engines run against its learner ranks on GPUs (``crl-bench plan``,
    Ray plans from ``layout_plan``): ``split``, engines and ranks on GPUs of their own (half of
    the role's GPUs each); ``colocated``, every GPU of the role holds an engine's share and a
    rank, the engines sleeping (vLLM sleep level 1) while the ranks update (official: actor_train
    and actor_infer both on GPUs 0-7, the memory model's engine and trainer on 8-15)."""
    offload_learner_states: bool = True
    """``colocated`` with full fine-tuning: the learner ranks' fp32 masters and AdamW moments go
    to host memory (pinned on CUDA) after each push and come back before the next update, so the
    engines have the GPUs during the rollout (official: ``offload_states`` before each rollout,
    roll/pipeline/agentic/agentic_pipeline.py:193); false keeps them on the GPUs."""


@_section("rollout")
@dataclass
class RolloutConfig(_Section):
    groups: int = 2
    """Task groups per step (G). Each group is one task instance played K times."""
    group_size: int = 4
    """K rollouts per group. With the split on, K/2 use experience and K/2 do not."""
    temperature: float = 0.99
    top_p: float = 0.99
    top_k: int = 0
    """Sample among the k most likely tokens only (0: off; the official runs use 100)."""
    max_new_tokens: int = 64
    """Tokens per actor turn."""
    conversation: Conversation = "window"
    """What the actor sees each turn. "window": a fresh prompt with the last ``history`` turns
    (summarised) and the current observation. "full" (official): the whole multi-turn chat, each
    turn appending the assistant's sampled tokens and the next observation, so that a turn's
    prompt is the previous turn's prompt + completion + the observation, token for token."""
    history: int = 2
    """Turns of history in the prompt (-1: the whole episode); "window" conversations only."""
    think: bool = False
    """Ask for <think>...</think> before the answer."""
    max_episode_tokens: int = 4096
    sequence_length: int = 0
    """Cap on a turn's prompt + generated tokens (official ``sequence_length``: 32,768); 0 = off
    (``max_episode_tokens`` counts generated tokens only)."""
    format_penalty: float = 0.0
    small_model_prompt: bool = False
    """Prompt settings under which a ~100M model emits valid answers (no thinking, an example
    answer, the assistant turn pre-filled with ``<answer>``). The pre-filled answer leaves no room
    for an ``<ask>``, so Search-and-Ask is effectively off with it."""
    example_pick: ExamplePick = "first"
    """The small-model prompt's example answer: "first" admissible action, a seeded "random"
    one per turn, "none", or "placeholder" (``<answer>ACTION</answer>``, no move named; see
    ``PromptConfig.example_pick``)."""
    observation_last: bool = False
    """The current observation after the admissible actions and the answer format instead of
    before them (``PromptConfig.observation_last``)."""
    prompt_layout: PromptLayout = "ours"
    """"official" (``paper``): the official env manager's messages for envs that give their
    official prompt pieces (MiniHack with ``view="official"``): the official system prompt, the
    env instruction and the turn template (``PromptConfig.layout``); needs
    ``conversation="full"``."""
    experience_place: ExperiencePlace = "user"
    """Where retrieved experience goes: the "user" message (ours) or, "system" (``paper``, as
    official), appended to the system message in the official memory header
    (``PromptConfig.experience_place``)."""
    experience_last: bool = False
    """The experience block just before the answer format instead of after the goal
    (``PromptConfig.experience_last``)."""
    stop_at_answer: bool = True
    """The actor's generation stops at ``</answer>`` as well as at the ask's closing tag (False,
    ``paper``: only at the ask's, as the official actor, yaml :101)."""
    max_observation_chars: int = 6000
    """An observation longer than this is cut in the middle (the prompt says so); 0: never cut
    (official: the env's observation goes into the turn template whole,
    ``traj_env_manager.py:390-406``; ``paper``)."""
    env_max_steps: dict[str, int] = field(default_factory=dict)
    """Per-family env action caps overriding the env defaults, e.g. {"minihack": 10}."""
    action_patterns: dict[str, str] = field(default_factory=dict)
    """Per env family, a regular expression an action reply must match as well (searched in the
    whole reply, dot matching newlines), else the turn is invalid format. ``paper``: ALFWorld's
    official ``action_pattern`` (``multitask_env_tool.yaml:365``, read by
    ``env/alfworld/env.py:384-395``): reasoning in ``<think>`` before the ``<answer>``."""
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-family ``gymnasium.make`` keyword arguments for every env of that family (training
    and evaluation), e.g. {"minihack": {"view": "compact"}}; checked against the env's
    constructor before anything loads."""


@dataclass
class OptimConfig(_Section):
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    schedule: Schedule = "constant"
    """"constant" or "cosine" (after warm-up)."""
    micro_batch_size: int = 4
    """Turn samples per forward/backward; gradients are accumulated over the whole batch."""
    micro_batch_tokens: int = 0
    """If > 0, a micro-batch also holds at most this many padded tokens (samples x longest
    sequence; a single longer sample still goes alone). Bounds activation memory when prompt
    lengths vary across env families; 0 = only ``micro_batch_size`` counts."""
    max_samples_per_update: int = 0
    """If > 0, train on a uniform random subset of this many turn samples per update (bounds CPU
    time; the subset is an unbiased sample of the batch). 0 uses every sample."""
    mini_batches: int = 1
    """Optimiser steps per update: the batch (after ``max_samples_per_update``) is shuffled and
    split into this many disjoint mini-batches, one step each, every ratio against the log-probs
    of the policy that played (PPO's minibatches: CleanRL ``num_minibatches``, verl
    ``ppo_mini_batch_size``). 1 = the official one optimiser step per batch."""
    loss: str = "ppo_clip"
    """The policy loss, a name in ``crl_bench.algorithms.LOSSES`` (``ppo_clip``, ``cispo``, ...)."""
    loss_args: dict[str, Any] = field(default_factory=dict)
    """Settings of that loss over its registered defaults, e.g. ``{"clip_eps": 0.2}`` for
    ``ppo_clip``, ``{"eps_low": 0.1, "eps_high": 0.1}`` for ``cispo``
    (``--set actor.loss_args.clip_eps=0.3``)."""
    agg: Aggregation = "token-mean"
    """How token losses become one number: ``token-mean``, ``seq-mean-token-mean``, ...
    (``crl_bench.algorithms.losses.aggregate``)."""
    recompute_old_logprobs: bool = False
    """Recompute the "old" log-probs with the trainer's own forward just before the update
    (official; the ratio is exactly 1 at the first micro-step) instead of using the sampler's."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them from
    the forward (less memory for long trajectories, ~1/3 more compute); the gradient is the
    same."""
    logprob_chunk_tokens: int = 0
    """If > 0, the log-probs of the scored tokens are computed over chunks of this many tokens,
    each chunk's vocabulary logits recomputed in the backward, so that the logits of a whole
    micro-batch (16 B x vocab per scored token) never exist at once; same values and gradients.
    0 = every scored token at once."""

    def loss_kwargs(self) -> dict[str, Any]:
        """The loss's keyword arguments: its registered defaults updated by ``loss_args``."""
        from crl_bench.algorithms import LOSSES

        return {**LOSSES.entry(self.loss).metadata.get("defaults", {}), **self.loss_args}


@_section("actor")
@dataclass
class ActorConfig(OptimConfig):
    advantage: str = "mean"
    """A name in ``crl_bench.algorithms.ADVANTAGES``: "mean" (subtract the subgroup mean: the
    official code), "mean_std", or one a plugin registers."""
    logprob_temperature: float = 0.0
    """The temperature the actor update computes log-probs at; 0: the sampling temperature
    (the recorded log-probs' own). Official (``paper``, 1.0): the trainer takes log-probs of the
    raw logits (``roll/distributed/strategy/megatron_strategy.py:238-263``, no temperature
    anywhere in that strategy); needs ``actor.recompute_old_logprobs`` (the sampler recorded
    its log-probs at the sampling temperature)."""
    sample_unit: SampleUnit = "turn"
    """What one training sample is. "turn": every model call (its prompt re-encoded).
    "trajectory" (official; needs ``rollout.conversation: full``): one sequence per episode, the
    last turn's full token sequence with the loss on every assistant turn, the shared prefix
    encoded once."""


@_section("extractor")
@dataclass
class ExtractorConfig(OptimConfig):
    loss: str = "cispo"
    buffer_size: int = 8
    """Train the extractor whenever this many credited samples are waiting (paper: 64)."""
    temperature: float = 0.99
    top_p: float = 0.99
    top_k: int = 0
    """Extractor sampling top-k (0: off; official 50, ROLL's generating-args default)."""
    max_new_tokens: int = 192
    max_ops: int = 3
    count_power: float = 0.5
    cooldown: int = 1
    count_reweight: bool = True
    """Count-aware reweighting of extractor samples in effect (the paper's description). False:
    every weight is 1, as in the official pipeline as launched (its usage look-up finds no
    training record, ``multi_agentic_pipeline.py:889``)."""
    max_reuse: int = 3
    """A credited sample is trained at most this many times (count-aware weights shrink it)."""
    credit_horizon: int = 4
    """Actor steps after which an extractor sample whose entries were never used is dropped."""
    runs: ExtractorRuns = "thread"
    """Where the extractor's work runs: "inline" (inside the actor loop's ``submit``, for
    debugging and exact resume tests), "thread" (the track in a background thread; its model
    calls share the actor's model behind one lock), or "process" (the track's thread stays here,
    its model and trainer in a worker process of their own: the actor never waits on the lock;
    ``crl_bench.extractor.worker``). With shared actor/extractor parameters "process" falls back
    to "thread" (one set of weights cannot live in two processes)."""
    max_trajectory_chars: int = 3000
    """The episode is shown to the extractor in at most this many characters (see
    ``crl_bench.extractor.extraction.trajectory_to_text``); 0 = no cut (official: the full
    conversation, 64k context)."""
    keep_reasoning: bool = False
    """Show the extractor each actor turn's whole output, reasoning included (official); False:
    only the parsed action."""
    distill: Distill = "all"
    """Which episodes are distilled: "all" K of each group, or "with_experience" (official: only
    the with-experience half, ``_should_update_trajectory_memory``)."""
    sample_policy: SamplePolicy = "pool"
    """"pool": every credited sample is trained at each update, up to ``max_reuse`` times, and
    dropped after ``credit_horizon`` steps without credit. "buffer" (official
    ``MemoryTrainingBuffer``): a sample enters a FIFO buffer (``buffer_size`` entries) when
    retrieval credits it; an update pops exactly ``buffer_size`` samples, each trained once on
    the credit it gathered since it last entered the buffer."""
    train_malformed: bool = True
    """Train malformed extractor outputs at reward -1 (False, official: they write nothing, are
    never retrieved and never trained)."""
    update_mode: UpdateMode = "in_place"
    """``update`` operations: "in_place" keeps the target's id (its earlier writers keep receiving
    credit); "replace" (official) deletes the targets and adds a new entry credited only to the
    writer of the update."""
    train_merges: bool = False
    """Merge calls become extractor samples, credited like adds by the use of the entries they
    create (official: merge calls are trained)."""
    wait_before_rollout: bool = False
    """Pending bank writes (distillation and merge of submitted steps) finish before each rollout
    (official flush); the wait is logged as ``timing_s/bank_wait``. False: never wait."""
    extraction_style: ExtractionStyle = "short"
    """The extraction prompt and parser: "short" (entries of one to four sentences, at most
    ``max_ops`` operations, texts capped, ``return`` alone) or "official" (detailed step-by-step
    entries; the parser caps nothing, accepts the official operation keys too, and applies the
    operations before a ``return``). See ``crl_bench.extractor.extraction``."""
    merge_format: MergeFormat = "ops"
    """The merge answer: "items" (official: ``<<<KNOWLEDGE_ITEM>>>`` blocks that replace the
    whole window; an entry left out is deleted) or "ops" (merge / rewrite / discard / keep
    decisions as JSON; entries not mentioned are kept). See ``crl_bench.extractor.merge``."""
    merge_style: MergeStyle = "ours"
    """"official" (``paper``): a merge window holds ``experience.merge_chunk`` fresh entries plus
    all the items the last window returned, merged entries start with fresh usage, the launched
    merge prompts verbatim, and one merge call per scope and pass is trained (its last call that
    changed the bank, credited by every entry the pass left). "ours": windows of at most
    ``merge_chunk`` entries, merged entries inherit their parents' usage, our shorter prompt,
    every call trained (``crl_bench.extractor.merge.merge_bank``)."""
    fence: Fence = "always"
    """With ``wait_before_rollout``: "always" waits for the pending bank writes before every
    rollout and merges after a batch's writes; "official" (``async_memory_fencing.py:4-5``,
    ``multi_agentic_pipeline.py:1237-1261``) skips the wait while an extractor update runs, and
    merges only inside the wait (every ``experience.merge_every`` steps, skipped with it)."""
    answer_template: AnswerTemplate = "free"
    """"free": the extractor writes its JSON operations itself. "content": the answer is
    pre-filled up to the content of one ``add`` and the model writes only that content (for
    models too small for the format; see ``crl_bench.extractor.extraction.ContentTemplate``).
    "sentence": the same, the content one sentence after a pre-filled stem, ended by a stop string
    (``SentenceTemplate``; merges then write one sentence under the window's title). "action":
    the sentence's stem asks for an action and the content must name one the episode took
    (``ActionTemplate``; for entries keyed by the episode's start)."""


@_section("experience")
@dataclass
class ExperienceConfig(_Section):
    embedder: str = "all-MiniLM-L6-v2"
    embed_max_tokens: int = 256
    """The embedder reads at most this many tokens of a text; 0: the model's own maximum
    (official: no cut below it, ``embedding/embedding_worker.py:72-76``; ``paper``)."""
    capacity: int = 20_000
    merge_every: int = 5
    """Merge the bank every this many steps (agents with ``method.merge``, which switches it)."""
    merge_chunk: int = 5
    merge_scope: MergeScope = "family"
    """What one merge window may mix: "family" (official: the entries of one task family) or
    "key" (only entries with the same retrieval key, i.e. under ``key=episode_start`` the same
    episode start; a merged entry keeps that key). With a one-item answer template (the ``cpu``
    preset's merges) "family" leaves one entry per family after each merge, so a bank keyed by
    the episode start needs "key" to keep an entry per start (``crl_bench.extractor.merge``)."""
    max_asks: int = 2
    """Search-and-Ask queries per episode (agents with ``method.search_ask``, which switches it)."""
    ask_k: int = 2
    """Entries a Search-and-Ask query retrieves (official: 1, ``memory_fetch_num``)."""
    key: RetrievalKey = "entry"
    """What an entry is embedded by: "entry" (its own title + content) or "episode_start" (the
    starting query, goal + first observation, of the episode it was distilled from: retrieval
    matches episode starts to episode starts, official)."""
    gate: bool = False
    """The actor accepts / refines / rejects each retrieved entry before it acts
    (:mod:`crl_bench.extractor.gate`; official: on, the ``paper`` preset): the verdict sets what it
    is shown and the credit it gives the entry's writer (score + 1, 0.5, -1). Read by every agent
    that retrieves; the one switch of the gate."""
    memory_warmup: int = 0
    """No entry is retrieved (training, evaluation, gate) until this many training steps have
    ended (official ``memory_warmup_interval: 5``, yaml :198: steps 0-4 play without memory;
    ``paper``). 0: retrieval from the first step (the bank is empty then)."""
    ask_tag: AskTag = "ask"
    """The Search-and-Ask tag the actor writes its query in (official, ``paper``:
    ``knowledge_search_and_ask``, ``tools/search_and_ask_tool.py:27``)."""
    ask_wins: bool = False
    """A reply with both an ask and an answer is an ask while asks are left (official,
    ``paper``: the tool wrapper parses its tool first, ``tool_env_wrapper.py:45-52``). False:
    the answer wins."""
    ask_answer_role: AskAnswerRole = "auto"
    """The role an ask's answer comes back in: "tool" (official: a tool-role message
    ``Search results: ...``, ``traj_env_manager.py:391-392``), "user" (a user turn), or "auto"
    (tool with ``ask_style=official`` in a full conversation, i.e. ``paper``; user elsewhere)."""
    ask_on_last_turn: bool = False
    """Offer Search-and-Ask on an episode's last turn too (official: the tool is offered on
    every turn and a call counts as a turn, ``traj_env_manager.py:282-291``, so an ask on the
    last turn ends the episode without an action; ``paper``). False: not offered there (the
    answer could not be acted on); with one-action episodes no ask is offered at all."""
    ask_offer: AskOffer = "with_experience"
    """Which episodes are offered Search-and-Ask: "with_experience" or "all" (official: the tool
    wrapper is on every env, both halves and evaluation; only the asks of with-experience
    training episodes are trained)."""
    ask_style: AskStyle = "short"
    """The extractor's Search-and-Ask answer: "short" (at most five sentences / 1,500
    characters; unparseable: the actor gets the entries, the call is malformed) or "official"
    (the long knowledge-specialist prompt, no cap; an answer without ``<answer>`` is the whole
    response, handed on and trained). See ``crl_bench.extractor.search_ask``."""
    gate_invalid_credit: bool = False
    """An unparseable gate verdict still credits the entry's writer with the plain episode score
    (official: only the shown knowledge is dropped). False: no credit."""
    query: Query = "goal_observation"
    """The retrieval query: "goal_observation" (goal + first observation, every family) or
    "family" (official ``build_memory_query``: MiniHack ``Observation: ...`` without the goal,
    WebShop ``Goal: ...``, others goal + observation)."""
    bank_fill_steps: int = 1
    """The first this many steps only fill the bank; the actor is not updated (paper text: 5;
    official code: 6, see the ``paper`` preset). Not the learning-rate warm-up
    (``actor.warmup_steps``)."""


@_section("retrieval")
@dataclass
class RetrievalSection(_Section, RetrievalSettings):
    """How entries are retrieved (``--set retrieval.k=2``): the fields, their defaults, ranges
    and checks are :class:`crl_bench.experience.retrieval.RetrievalSettings`, handed to the
    experience manager whole. The old spellings ``experience.k`` etc. are :data:`ALIASES`."""


@_section("eval")
@dataclass
class EvalConfig(_Section):
    every: int = 5
    """Evaluate every N steps (and always at the end). 0: only at the end."""
    episodes_per_task: int = 8
    """Held-out episodes per task, each played with and without experience."""
    at_start: bool = True
    modes: EvalModes = "both"
    """Evaluation modes: "both" (without and with experience) or "with_experience" (official:
    ``eval_memory_split`` off, every evaluation episode with memory)."""
    temperature: float | None = None
    """The actor's sampling temperature in evaluation: None samples as in training
    (``rollout.temperature``); 0 is greedy decoding (the policy's most likely move)."""
    swe_verified: bool = False
    """Evaluate SWE tasks on SWE-bench Verified where its data exists (a SWE-bench Verified
    instances file named by ``$CRL_BENCH_SWE_VERIFIED``; without it SWE evaluates on its own task
    set). The paper does (``paper``); training stays on the task's own set."""


@_section("")
@dataclass
class RunConfig(_Section):
    agent: str = DEFAULT_AGENT
    """The agent's registered name (``--agent``)."""
    method: dict[str, Any] = field(default_factory=dict)
    """The agent's own options over its defaults (``--set method.merge=false``); the agent checks
    the names (``crl_bench.agent.Agent.with_options``)."""
    tasks: str = DEFAULT_TASKS
    """A task mix (``crl-bench list mixes``) or comma-separated env ids (``--tasks``)."""
    preset: str | None = None
    """The preset the configuration was built from (``--preset``; None: the base, ``RunConfig()``
    itself). ``build_config`` sets it; without ``--preset`` that is :func:`default_preset`."""
    seed: int = 0
    steps: int = 10
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    extractor: ExtractorConfig = field(default_factory=ExtractorConfig)
    experience: ExperienceConfig = field(default_factory=ExperienceConfig)
    retrieval: RetrievalSection = field(default_factory=RetrievalSection)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint_every: int = 1
    threads: int = 0
    """torch CPU threads (0: leave torch's default)."""

    def validate(self) -> None:
        """Reject configurations that cannot work, naming the field and the fix. Run once per run,
        where the configuration is final (:func:`build_config`; a resumed run's stored one after
        its resume overrides).

        Checks every field's type and range (:data:`crl_bench.config.validation.FIELD_RANGES`),
        the choices of the ``Literal``-typed fields, names against the registries (agents and
        their ``method.*`` options, task mixes, losses and their argument ranges, advantages,
        backends), old names (:data:`DEPRECATED`) and the model names, without building
        anything."""
        from crl_bench.config.validation import validate_config

        for key in self.method:
            refuse_deprecated(f"method.{key}")
        validate_config(self, presets=PRESETS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    """A named configuration: the base ``RunConfig()`` with :attr:`changes`."""

    name: str
    summary: str
    """One line for ``--preset``'s help, ``crl-bench list presets`` and the docs."""
    changes: dict[str, Any]
    """Dotted setting (``--set`` spelling) -> value, where the preset differs from the base."""

    def __call__(self) -> RunConfig:
        cfg = RunConfig()
        for key, value in self.changes.items():
            *path, name = canonical_key(key).split(".")
            obj: Any = cfg
            for part in path:
                obj = getattr(obj, part)
            setattr(obj, name, copy.deepcopy(value))
        cfg.preset = self.name
        return cfg


# tiny-sft: the 2-layer test model after a few hundred supervised steps on answers in the prompts'
# formats (crl_bench.llm.models), so that tiny runs make real updates: ~80% of its actor turns in
# MiniHack runs are valid (a random-ish walk that reaches the stairs in some episodes: 2 groups, 8
# moves), 3/4+ of its extractor answers parse. The format penalty turns the invalid rest into
# reward differences inside a group; 24 tokens fit an ask.
TINY = Preset("tiny", "a 2-layer test model (tiny-sft) for tests and CI: a run takes a minute or "
              "two on 2 CPU cores; its numbers mean nothing", {
                  "steps": 3,
                  "model.actor": "tiny-sft", "model.lora_r": 4, "model.lora_alpha": 8,
                  "rollout.max_new_tokens": 24, "rollout.history": 1,
                  "rollout.max_episode_tokens": 2048, "rollout.format_penalty": 0.1,
                  "rollout.env_max_steps": {"minihack": 8, "webshop": 4, "alfworld": 4, "swe": 3},
                  "actor.lr": 1e-4, "actor.micro_batch_size": 8,
                  "extractor.lr": 1e-4, "extractor.buffer_size": 2, "extractor.max_new_tokens": 64,
                  "extractor.credit_horizon": 2,
                  "experience.merge_every": 2, "experience.max_asks": 1,
                  "eval.every": 2, "eval.episodes_per_task": 2,
              })

# Sized for 2 CPU cores (measured, one torch thread per run, two runs side by side): a step of 48
# sampled turns took 301 s, 185 s of it the actor update; 24 turns halve the update.
_SMALL_MODEL = {
    # format_penalty: until the 135M model solves a task, every outcome is 0 and GRPO has no
    # signal; a small penalty per malformed turn gives it one (answer in the format).
    # example_pick="random": with the first admissible action as the example answer, GRPO
    # collapsed onto it (89-93% "north" after 10 steps; results/learning_minihack)
    "rollout.max_new_tokens": 16, "rollout.small_model_prompt": True,
    "rollout.format_penalty": 0.05, "rollout.example_pick": "random",
    # micro-batches of 4 turns: with 8 (x ~400 tokens) the backward pass peaked at 10.5 GB
    "actor.lr": 1e-4, "actor.micro_batch_tokens": 2048,
    # answer_template="sentence": SmolLM2-135M writes no valid JSON operations on its own (0/16
    # valid: experiments/extractor_format.py); with the template it writes only one sentence of an
    # add's content after a pre-filled stem. merge_format="items": merges in the official item
    # format, pre-filled up to one sentence of one item (the window's title); the measured shares
    # are in experiments/extractor_format.py's docstring
    "extractor.lr": 1e-4, "extractor.max_new_tokens": 48, "extractor.micro_batch_size": 2,
    "extractor.micro_batch_tokens": 2048, "extractor.max_samples_per_update": 8,
    "extractor.answer_template": "sentence", "extractor.merge_format": "items",
    "extractor.max_trajectory_chars": 1500,
}
"""What the embedded SmolLM2-135M needs to write valid answers (``cpu`` and ``quick``)."""

CPU = Preset("cpu", "the embedded SmolLM2-135M-Instruct and MiniLM embedder, small groups and "
             "short episodes: minutes per step on 2 CPU cores", {
                 **_SMALL_MODEL, "rollout.history": 1,
                 # the extractor's model in its own process: the actor loop does not wait while
                 # it distils or trains (benchmarks/actor_wait.py)
                 "extractor.runs": "process",
                 "rollout.env_max_steps": {"minihack": 10, "webshop": 8, "alfworld": 15, "swe": 10},
                 "actor.max_samples_per_update": 24,
             })
"""Measured on 2 CPU cores, two runs side by side with one thread each: 10 MiniHack steps plus 3
evaluations took 68 min for ``grpo``; a ``comp_rl`` step takes about 7 min (the extractor shares
the model); ``3mix`` plays three families and takes several hours."""

QUICK = Preset("quick", "cpu cut down so that `crl-bench run` ends in under 15 min on 2 idle CPU "
               "cores: a look at the whole pipeline, not a result (the default without a GPU)", {
                   **_SMALL_MODEL, "steps": 2, "extractor.runs": "process",
                   # the second step's rollout waits for the first step's bank writes: the
                   # extractor works in its own process and would otherwise still be distilling
                   "extractor.wait_before_rollout": True,
                   "rollout.groups": 3, "rollout.history": 0,
                   "rollout.env_max_steps": {"minihack": 6, "webshop": 5, "alfworld": 6, "swe": 6},
                   "actor.max_samples_per_update": 16,
                   "eval.every": 0, "eval.episodes_per_task": 2, "eval.at_start": False,
               })
"""On CPU the cost is prompt tokens times turns (results/quick_start.md): 2 steps (the first fills
the bank, the second trains the actor with experience) of one group of 4 per family, 5-6 actions
per episode, no previous turn in the prompt (history 0: ~20% shorter prompts), at most 16 turns
per actor update, and one evaluation at the end only, 2 held-out episodes per task and mode (at
step 0 the bank is empty, so "with experience" there would replay "without")."""

PAPER = Preset("paper", "the paper's configuration for GPUs (Qwen2.5-7B-Instruct actor, "
               "Qwen3-4B-Thinking extractor, K=8, 16 groups, 512 steps; the default with a GPU)", {
                   "steps": 512,
                   "model.actor": "Qwen/Qwen2.5-7B-Instruct",
                   "model.extractor": "Qwen/Qwen3-4B-Thinking-2507",
                   "model.backend": "vllm", "model.dtype": "bfloat16", "model.device": "cuda",
                   "model.lora_r": 0, "model.lora_alpha": 128,
                   # vLLM engines (official yaml: actor_infer gpu_memory_utilization 0.85;
                   # memory_model 0.7, max_model_len 65536, tensor_parallel_size 4)
                   # (the utilizations are the base's defaults)
                   "model.actor_max_model_len": 32768,
                   "model.extractor_max_model_len": 65536, "model.extractor_tensor_parallel": 4,
                   # a role's training and inference on the same GPUs (yaml device_mapping
                   # list(range(0,8)) for actor_train :87 and actor_infer :111; the memory
                   # model's engine and trainer both list(range(8, 16)) :247, :291)
                   "model.placement": "colocated",
                   # a checkpoint every 100 steps (yaml :29 save_steps: 100)
                   "checkpoint_every": 100,
                   # the actor sees the whole conversation, 4,096 new tokens per turn, top-k 100
                   "rollout.groups": 16, "rollout.group_size": 8, "rollout.top_k": 100,
                   "rollout.max_new_tokens": 4096, "rollout.conversation": "full",
                   "rollout.history": -1, "rollout.think": True,
                   "rollout.max_observation_chars": 0, "rollout.stop_at_answer": False,
                   "experience.ask_tag": "knowledge_search_and_ask", "experience.ask_wins": True,
                   # the official MiniHack observation and messages: the 9x9 crop, legend,
                   # message and action list (env.py:526-583, :383-394), the maze system prompt,
                   # env instruction and turn template, memory in the system message
                   # (traj_env_manager.py:101-108, :358-406; multitask_env_tool.yaml:263-279);
                   # no step penalty (yaml :279 penalty_step: 0.0; NLE's default is -0.01)
                   "rollout.env_kwargs": {"minihack": {"view": "official", "penalty_step": 0.0}},
                   "rollout.prompt_layout": "official", "rollout.experience_place": "system",
                   "rollout.max_episode_tokens": 32768, "rollout.sequence_length": 32768,
                   "rollout.env_max_steps": {"minihack": 30, "webshop": 15, "alfworld": 30, "swe": 50},
                   "rollout.action_patterns": {
                       "alfworld": r"<think>(.*?)</think>\s*<answer>(.*?)</answer>($|\n)"},
                   # one sequence per trajectory, loss on every assistant turn,
                   # seq-mean-token-mean, old log-probs recomputed by the trainer (official ROLL)
                   "actor.lr": 1e-6, "actor.loss_args": {"clip_eps": 0.2}, "actor.micro_batch_size": 8,
                   "actor.sample_unit": "trajectory", "actor.agg": "seq-mean-token-mean",
                   "actor.recompute_old_logprobs": True, "actor.logprob_temperature": 1.0,
                   # memory only (same gradient): log-probs over chunks of 4,096 tokens (no
                   # full-vocabulary logits of a 32k-token sequence), one such sequence per
                   # micro-batch; `crl-bench plan --preset paper` fits 16 x 80 GB with these
                   "actor.logprob_chunk_tokens": 4096, "actor.micro_batch_tokens": 32768,
                   "extractor.logprob_chunk_tokens": 4096, "extractor.micro_batch_tokens": 40960,
                   # full activation recompute (yaml recompute_granularity: full, both trained
                   # models): the plan's verdict assumes it
                   "actor.activation_checkpointing": True,
                   "extractor.activation_checkpointing": True,
                   "extractor.lr": 1e-6, "extractor.loss_args": {"eps_low": 0.1, "eps_high": 0.1},
                   "extractor.buffer_size": 64, "extractor.max_new_tokens": 8192,
                   "extractor.agg": "seq-mean-token-mean", "extractor.recompute_old_logprobs": True,
                   "extractor.max_trajectory_chars": 0, "extractor.keep_reasoning": True,
                   "extractor.distill": "with_experience", "extractor.sample_policy": "buffer",
                   "extractor.train_malformed": False, "extractor.update_mode": "replace",
                   "extractor.train_merges": True, "extractor.wait_before_rollout": True,
                   # yaml :251 temperature 1.0; top-k 50: ROLL's generating-args default;
                   # count-aware weights not in effect as launched
                   "extractor.temperature": 1.0, "extractor.top_k": 50,
                   "extractor.count_reweight": False, "extractor.merge_format": "items",
                   "extractor.merge_style": "official",
                   "extractor.extraction_style": "official", "extractor.fence": "official",
                   "experience.embedder": "Qwen/Qwen3-Embedding-0.6B", "experience.ask_k": 1,
                   "experience.embed_max_tokens": 0,
                   "experience.key": "episode_start", "experience.gate": True,
                   "experience.bank_fill_steps": 6, "experience.ask_offer": "all",
                   "experience.ask_on_last_turn": True, "experience.memory_warmup": 5,
                   "experience.ask_style": "official", "experience.gate_invalid_credit": True,
                   "experience.query": "family", "retrieval.usage_per": "batch",
                   # yaml eval_steps: 1, val_batch_size: 128, eval_memory_split off
                   "eval.every": 1, "eval.episodes_per_task": 128, "eval.modes": "with_experience",
                   "eval.swe_verified": True,  # the paper evaluates SWE on SWE-bench Verified
               })
"""The official MiniHack single-task configuration (the ComplementaryRL fork of ROLL at ab2574f,
``examples/singletask-agentic/single_task_complementaryrl.yaml``; every mechanism, its source and
its test: ``docs/fidelity.md``). The rest of the base (k 1, oversample 16, lam 0.4, recent 300 s,
drop 0.5, capacity 20,000, merge every 5 in chunks of 5, 2 asks, top-p 0.99, temperature 0.99,
PPO-clip actor, CISPO extractor, mean advantages) is the official value too.

* Both models train **all parameters** at lr 1e-6 (yaml ``learning_rate: 1.0e-6`` for
  ``actor_train`` and ``memory_actor_train``, no LoRA): ``model.lora_r=0``, generated with the
  ``vllm`` backend (each update's full weights pushed into the engine in place, versioned;
  docs/vllm.md). Memory: each role keeps a frozen copy of its base beside the trained one, plus
  AdamW state (the official run spreads this over 16 GPUs).
* Extractor: 8,192 new tokens (yaml ``memory_model ... max_new_tokens: 8192``), the full
  conversation with the actor's reasoning, only the with-experience half distilled, the official
  training buffer (64, popped whole, once per new credit), malformed outputs not trained, updates
  replace entries, merge calls trained, entries keyed by their episode's start, bank writes
  flushed before each rollout, the accept / refine / reject gate.
* Search-and-Ask retrieves 1 entry (``memory_fetch_num: 1``); ALFWorld 30 actions (official
  ALFWorld yaml); bank fill 6 steps: the official loop trains the actor only once
  ``global_step > memory_warmup_interval`` (5) with steps counted from 0
  (``multi_agentic_pipeline.py:1202, 1470``), i.e. 6 steps without an actor update; ours count
  from 1 and skip ``step <= bank_fill_steps``.
* SWE: the paper evaluates on SWE-bench Verified. Where its data exists — a SWE-bench Verified
  instances file named by ``$CRL_BENCH_SWE_VERIFIED`` (run by the env's docker backend) —
  ``paper`` evaluates SWE on it; otherwise (as on this project's machines, which have neither the
  data nor Docker) SWE runs our ``mini`` task set, as under every preset (the setting is
  ``eval.swe_verified``; any preset or ``--set`` may turn it on). Training stays on
  ``mini``: the paper's 124 curated training tasks are not published.
"""

PRESETS: dict[str, Preset] = {p.name: p for p in (TINY, QUICK, CPU, PAPER)}
"""The presets by name: ``PRESETS["cpu"]()`` is that configuration."""


def default_preset() -> str:
    """``quick`` when no CUDA device is present, else ``paper``."""
    try:
        import torch

        return "paper" if torch.cuda.is_available() else "quick"
    except ImportError:
        return "quick"


def _coerce(value: Any, current: Any, key: str) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if isinstance(current, bool) and not isinstance(value, bool):
        raise ConfigError(f"--set {key}: expected true/false, got {value!r}")
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(current, int) and not isinstance(current, bool) and isinstance(value, float) and value.is_integer():
        value = int(value)
    if current is not None and not isinstance(current, (dict, list)) and type(value) is not type(current):
        raise ConfigError(f"--set {key}: expected {type(current).__name__}, got {value!r}")
    return value


def apply_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """Apply ``{"actor.lr": 2e-5, "steps": 4}``; unknown keys list the valid ones; an old
    spelling (:data:`ALIASES`) sets the setting's name now."""
    for key, value in overrides.items():
        key = canonical_key(key)
        if key.startswith("method."):  # the agent's options: an old one is refused here
            refuse_deprecated(key)
        obj: Any = cfg
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            if isinstance(obj, dict):  # a dict field: the rest of the key is one dict key
                obj[".".join(parts[i:])] = _coerce(value, None, key)
                break
            if not dataclasses.is_dataclass(obj) or part not in {f.name for f in fields(obj)}:
                refuse_deprecated(key)
                from crl_bench.registry import did_you_mean

                here = [f.name for f in fields(obj)] if dataclasses.is_dataclass(obj) else []
                sections = [f.name for f in fields(cfg)
                            if dataclasses.is_dataclass(getattr(cfg, f.name))]
                raise ConfigError(f"--set {key}: unknown section {part!r}. Sections: "
                                  + ", ".join(sections) + "."
                                  + did_you_mean(part, sections if i == 0 else here))
            obj = getattr(obj, part)
        else:
            _set_field(obj, parts[-1], value, key)
    return cfg


def _set_field(obj: Any, name: str, value: Any, key: str) -> None:
    if isinstance(obj, dict):
        obj[name] = _coerce(value, None, key)
        return
    names = {f.name for f in fields(obj)}
    if name not in names:
        refuse_deprecated(key)
        from crl_bench.registry import did_you_mean

        hint = did_you_mean(name, names)
        if not hint and isinstance(obj, RunConfig):  # a field of a section, given bare (lr)
            dotted = [f"{f.name}.{name}" for f in fields(obj)
                      if dataclasses.is_dataclass(getattr(obj, f.name))
                      and name in {g.name for g in fields(getattr(obj, f.name))}]
            hint = f" Did you mean {' or '.join(map(repr, dotted))}?" if dotted else ""
        raise ConfigError(f"--set {key}: unknown field {name!r}. Fields here: "
                          f"{', '.join(sorted(names))}.{hint}")
    setattr(obj, name, _coerce(value, getattr(obj, name), key))


RESUMABLE_OVERRIDES = frozenset({"threads", "extractor.runs"})
"""Fields a resumed run may change: they set how fast it runs, not what it computes."""


def apply_resume_overrides(cfg: RunConfig, overrides: dict[str, Any] | None) -> RunConfig:
    """Overrides for a resumed run: only :data:`RESUMABLE_OVERRIDES`; anything else would make
    the continued run a different experiment, so it is refused with the way out."""
    if not overrides:
        return cfg
    trial = apply_overrides(copy.deepcopy(cfg), overrides)

    def value(c: RunConfig, key: str) -> Any:
        for part in key.split("."):
            c = getattr(c, part)
        return c

    # the same values as stored are fine (reproduce passes its overrides to every run it resumes)
    other = sorted(k for k in overrides if k not in RESUMABLE_OVERRIDES and value(trial, k) != value(cfg, k))
    if other:
        raise ConfigError(f"--resume continues the stored configuration; {', '.join(other)} cannot "
                          f"change mid-run (allowed: {', '.join(sorted(RESUMABLE_OVERRIDES))}). "
                          "Start a new run with another --out to change it.")
    return trial


def build_config(*, agent: str | None = None, tasks: str | None = None, preset: str | None = None,
                 seed: int = 0, steps: int | None = None,
                 overrides: dict[str, Any] | None = None) -> RunConfig:
    """Preset -> overrides -> validation, the one validation of a new run's configuration
    (also checks that a GPU preset has a GPU). None: :data:`DEFAULT_AGENT`,
    :data:`DEFAULT_TASKS`, :func:`default_preset`."""
    agent, tasks = agent or DEFAULT_AGENT, tasks or DEFAULT_TASKS
    preset = preset or default_preset()
    if preset not in PRESETS:
        raise ConfigError(f"Unknown preset {preset!r}. Available: {', '.join(PRESETS)}.")
    cfg = PRESETS[preset]()
    cfg.agent, cfg.tasks, cfg.seed = agent, tasks, seed
    if steps is not None:
        cfg.steps = steps
    overrides = dict(overrides or {})
    # the run's identity has its own options; a --set that disagrees with them is refused (one
    # that agrees is harmless), so that `--agent comp_rl --set agent=grpo` cannot run grpo
    explicit = {"agent": ("--agent", agent), "tasks": ("--tasks", tasks), "seed": ("--seed", seed),
                "preset": ("--preset", preset)}
    if steps is not None:
        explicit["steps"] = ("--steps", steps)
    for key, (option, given) in explicit.items():
        if key in overrides:
            value = _coerce(overrides.pop(key), given, key)
            if value != given:
                raise ConfigError(f"--set {key}={value!r} conflicts with {option} {given!r}: give "
                                  f"the {key} with {option} {value} only.")
    apply_overrides(cfg, overrides)
    cfg.validate()  # every field, once, before anything is built
    if cfg.model.device == "cuda" or cfg.model.backend == "vllm":
        try:
            import torch

            has_gpu = torch.cuda.is_available()
        except ImportError:
            has_gpu = False
        if not has_gpu:
            raise ConfigError(
                f"preset {preset!r} needs a CUDA GPU (model.device={cfg.model.device!r}, "
                f"backend={cfg.model.backend!r}) and none is visible. On a CPU use --preset cpu "
                "(embedded SmolLM2) or --preset tiny, or override --set model.device=cpu "
                "--set model.backend=hf.")
    return cfg


def config_from_dict(data: Any) -> RunConfig:
    """Rebuild a :class:`RunConfig` from ``config.json`` (used by ``--resume``).

    Raises:
        ConfigError: ``data`` is not a configuration (not an object, unknown or mistyped
            sections/fields); the caller names the file.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object of run settings, got {type(data).__name__}")
    sections = {"model": ModelConfig, "rollout": RolloutConfig, "actor": ActorConfig,
                "extractor": ExtractorConfig, "experience": ExperienceConfig, "eval": EvalConfig,
                "retrieval": RetrievalSection}
    kwargs = {key: dict(value) if isinstance(value, dict) and key in sections else value
              for key, value in data.items()}
    for old, new in ALIASES.items():  # a run stored before a setting moved: its old spelling
        (section, name), (new_section, new_name) = old.split("."), new.split(".")
        if isinstance(kwargs.get(section), dict) and name in kwargs[section]:
            moved = kwargs[section].pop(name)
            if isinstance(kwargs.setdefault(new_section, {}), dict):
                kwargs[new_section].setdefault(new_name, moved)
    for name, cls in sections.items():
        if name in kwargs:
            if not isinstance(kwargs[name], dict):
                raise ConfigError(f"section {name!r} must be a JSON object, got {kwargs[name]!r}")
            try:
                kwargs[name] = cls(**kwargs[name])
            except ConfigError:
                raise
            except (TypeError, ValueError) as exc:  # ValueError: retrieval's own checks
                raise ConfigError(f"section {name!r}: {exc}") from None
    try:
        return RunConfig(**kwargs)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
