"""Validation of a :class:`~crl_bench.config.schema.RunConfig`: every field's type and range, every
name against its registry, model names — before anything is built. A bad value raises
:class:`~crl_bench.config.schema.ConfigError` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import re
import types
import typing
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Literal

from crl_bench.algorithms.ranges import Range
from crl_bench.config.errors import ConfigError
from crl_bench.experience.retrieval import setting_ranges

if TYPE_CHECKING:  # pragma: no cover
    from crl_bench.config.schema import RunConfig


MAX_GROUP_SIZE = 1024
"""Most rollouts per group (K). The paper uses 8."""
MAX_EPISODES_PER_STEP = 4096
"""Most concurrent episodes: ``rollout.groups * rollout.group_size`` per training step, and
``eval.episodes_per_task`` per evaluated task. Each holds a live env (MiniHack: tens of MB) and
its prompts, so more exhausts memory (the paper: 16 x 8 = 128)."""
MAX_TOKENS = 1 << 20
"""Most tokens per turn / per episode."""
MAX_STEPS = 1_000_000
MAX_SEED = 2**31 - 1
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


_OPTIM_RANGES = {
    "lr": Range(0, 1, lo_open=True),
    "weight_decay": Range(0, 10),
    "max_grad_norm": Range(0, 1e6, lo_open=True),
    "warmup_steps": Range(0, MAX_STEPS),
    "micro_batch_size": Range(1, 4096),
    "micro_batch_tokens": Range(0, MAX_TOKENS * 16, note="0: no token cap"),
    "max_samples_per_update": Range(0, 1 << 24, note="0: every sample"),
    "logprob_chunk_tokens": Range(0, MAX_TOKENS * 16, note="0: no chunks"),
}

FIELD_RANGES: dict[str, Range] = {
    "seed": Range(0, MAX_SEED),
    "steps": Range(1, MAX_STEPS),
    "checkpoint_every": Range(1, MAX_STEPS, note="checkpoint every N steps and at the last"),
    "threads": Range(0, 1024, note="0: torch's default"),
    "model.lora_r": Range(0, 4096, note="0: full fine-tuning (hf backend)"),
    "model.lora_alpha": Range(1, 65536),
    "model.max_batch_size": Range(1, 1 << 20),
    "model.actor_gpu_memory_utilization": Range(0, 1, lo_open=True),
    "model.extractor_gpu_memory_utilization": Range(0, 1, lo_open=True),
    "model.actor_max_model_len": Range(0, MAX_TOKENS * 4, note="0: the longest episode"),
    "model.extractor_max_model_len": Range(0, MAX_TOKENS * 4,
                                           note="0: an episode + the extractor's answer"),
    "model.actor_tensor_parallel": Range(1, 64),
    "model.extractor_tensor_parallel": Range(1, 64),
    "rollout.groups": Range(1, MAX_EPISODES_PER_STEP),
    "rollout.group_size": Range(1, MAX_GROUP_SIZE),
    "rollout.temperature": Range(0, 10, lo_open=True),
    "rollout.top_p": Range(0, 1, lo_open=True),
    "rollout.max_new_tokens": Range(1, MAX_TOKENS),
    "rollout.history": Range(-1, 1024, note="-1: the whole episode"),
    "rollout.max_episode_tokens": Range(1, MAX_TOKENS),
    "rollout.sequence_length": Range(0, MAX_TOKENS, note="0: off"),
    "rollout.format_penalty": Range(0, 100),
    **{f"actor.{k}": v for k, v in _OPTIM_RANGES.items()},
    **{f"extractor.{k}": v for k, v in _OPTIM_RANGES.items()},
    "extractor.buffer_size": Range(1, 1 << 20),
    "extractor.temperature": Range(0, 10, lo_open=True),
    "extractor.top_p": Range(0, 1, lo_open=True),
    "extractor.top_k": Range(0, 1 << 20, note="0: off"),
    "extractor.max_new_tokens": Range(1, MAX_TOKENS),
    "extractor.max_ops": Range(1, 64),
    "extractor.count_power": Range(0, 10),
    "extractor.cooldown": Range(0, MAX_STEPS),
    "extractor.max_reuse": Range(1, MAX_STEPS),
    "extractor.credit_horizon": Range(1, MAX_STEPS),
    "extractor.max_trajectory_chars": Range(0, 1 << 24, note="0: no cut"),
    "experience.capacity": Range(1, 100_000_000),
    "experience.merge_every": Range(1, MAX_STEPS, note="merging is switched off by method.merge=false"),
    "experience.merge_chunk": Range(1, 1024),
    "experience.max_asks": Range(1, 64, note="Search-and-Ask is switched off by "
                                 "method.search_ask=false"),
    "experience.bank_fill_steps": Range(0, MAX_STEPS),
    "experience.ask_k": Range(1, 64),
    "experience.embed_max_tokens": Range(0, MAX_TOKENS, note="0: the model's own maximum"),
    "experience.memory_warmup": Range(0, MAX_STEPS, note="0: retrieval from the first step"),
    "rollout.max_observation_chars": Range(0, 1 << 24, note="0: never cut"),
    "rollout.top_k": Range(0, 1 << 20, note="0: off"),
    "actor.mini_batches": Range(1, 1024),
    "actor.logprob_temperature": Range(0, 10, note="0: the sampling temperature"),
    "extractor.mini_batches": Range(1, 1024),
    "eval.every": Range(0, MAX_STEPS, note="0: only at the end"),
    "eval.episodes_per_task": Range(1, MAX_EPISODES_PER_STEP),
    "eval.temperature": Range(0, 10, note="0: greedy; unset: as in training"),
    # declared on the fields of crl_bench.experience.retrieval.RetrievalSettings
    **{f"retrieval.{name}": rng for name, rng in setting_ranges().items()},
}
"""Allowed range of every numeric field, by dotted name (``--set`` spelling)."""

ENV_MAX_STEPS_RANGE = Range(1, 100_000)


def _fix(key: str, example: Any) -> str:
    return f"e.g. --set {key}={json.dumps(example)}"


def _check_type(key: str, value: Any, annotation: str) -> None:
    """``annotation`` is the field's annotation string (``from __future__ import annotations``)."""
    ann = annotation.replace(" ", "")
    optional = ann.endswith("|None")
    base = ann[:-len("|None")] if optional else ann
    if value is None and optional:
        return
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
    }.get(base)
    if base.startswith("dict["):
        ok = lambda v: isinstance(v, dict)  # noqa: E731
    if ok is not None and not ok(value):
        want = {"int": "an integer", "float": "a number", "bool": "true or false",
                "str": "a string"}.get(base, base)
        raise ConfigError(f"{key}={value!r}: must be {want}"
                          + (" or null" if optional else "") + ".")


def literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal[...]`` (or ``Literal[...] | None``) type; None for any
    other type."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            choices = literal_choices(arg)
            if choices is not None:
                return choices
    return None


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_choices(section: Any, name: str) -> tuple[Any, ...] | None:
    """The choices of field ``name`` of a config section (class or instance), read from its
    ``Literal`` type; None when the field is not a fixed choice."""
    cls = section if isinstance(section, type) else type(section)
    return literal_choices(_hints(cls).get(name))


def _did_you_mean(value: Any, names: list[str]) -> str:
    close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6) or [
        n for n in names if str(value) and n.startswith(str(value))][:1]
    return f" Did you mean {close[0]!r}?" if close else ""


def _check_name(key: str, value: str, known: Any, what: str) -> None:
    names = sorted(known)
    if value not in names:
        raise ConfigError(f"{key}={value!r}: unknown {what}. Available: {', '.join(names)}."
                          f"{_did_you_mean(value, names)} "
                          f"({_fix(key, names[0]) if names else 'none registered'}).")


MAX_TASKS = 64
"""Tasks one run may train on (the largest built-in mix has 6)."""


def check_model_name(key: str, name: Any) -> None:
    """A model name is a known short name, a folder with a Hugging Face ``config.json``, or a hub
    id ``owner/name``; anything else (a file such as ``/etc/passwd``, a missing path) is refused
    here, before a model is built. Nothing is downloaded or built."""
    from pathlib import Path

    from crl_bench.llm.models import KNOWN_MODELS

    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{key}={name!r}: must be a model name ({', '.join(KNOWN_MODELS)}, a "
                          "hub id 'owner/name' or a model folder).")
    if name in KNOWN_MODELS:
        return
    if len(name) > 4096:
        raise ConfigError(f"{key}: a name of {len(name):,} characters is not a model name, a hub "
                          "id or a folder; give a known short name or a path.")
    path = Path(name).expanduser()
    hint = (f"Give a known short name ({', '.join(KNOWN_MODELS)}), a hub id 'owner/name', or a "
            f"folder holding a Hugging Face checkpoint (config.json), e.g. --set {key}=smollm2-135m.")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{key}={name!r}: the folder has no config.json, so it is not a "
                              f"Hugging Face model. {hint}")
        return
    if path.exists():
        raise ConfigError(f"{key}={name!r}: that is a file, not a model. {hint}")
    if name.count("/") == 1 and not name.startswith((".", "/", "~")) and all(name.split("/")):
        return  # a hub id: resolved (cache or download) when the model is built
    raise ConfigError(f"{key}={name!r}: not a known model, an existing folder or a hub id. {hint}")


def check_embedder_name(key: str, name: Any) -> None:
    """An embedder is the packaged default, a sentence-transformers name or hub id, or a folder
    holding a sentence-transformers model; a path that does not exist, a file, or a folder
    without a model is refused here, before anything loads."""
    from pathlib import Path

    from crl_bench.experience.embedder import DEFAULT_EMBEDDER

    hint = (f"Give {DEFAULT_EMBEDDER} (packaged), a hub id 'owner/name' available offline, or a "
            f"folder holding a sentence-transformers model; e.g. --set {key}={DEFAULT_EMBEDDER}.")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{key}={name!r}: must name an embedder. {hint}")
    path = Path(name).expanduser()
    if path.is_dir():
        if not ((path / "modules.json").is_file() or (path / "config.json").is_file()):
            raise ConfigError(f"{key}={name!r}: the folder holds no sentence-transformers model "
                              f"(no modules.json or config.json). {hint}")
        return
    if path.exists():
        raise ConfigError(f"{key}={name!r}: that is a file, not an embedder. {hint}")
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name
    if looks_like_path:
        raise ConfigError(f"{key}={name!r}: no such folder. {hint}")


def check_device_usable(device: str) -> None:
    """``model.device`` names a device this machine has (``auto`` and ``cpu`` always do):
    ``cuda:99`` on a machine with one GPU is refused here, before a model is loaded, not by an
    assertion inside torch after it."""
    if device in ("auto", "cpu"):
        return
    try:
        import torch
    except ImportError:
        raise ConfigError(f"model.device={device!r}: torch is not installed (pip install "
                          "'crl-bench[train]'), so no accelerator can be used.") from None
    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError("model.device='mps': no Apple GPU (MPS) is available on this "
                              "machine; use --set model.device=cpu (or auto).")
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(f"model.device={device!r}: no CUDA GPU is visible on this machine; use "
                          "--set model.device=cpu (or auto: a GPU when there is one).")
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= count:
        have = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise ConfigError(f"model.device={device!r}: this machine has {count} CUDA device(s) "
                          f"({have}); e.g. --set model.device=cuda:0.")


_SECTION_TYPES = ("ModelConfig", "RolloutConfig", "ActorConfig", "ExtractorConfig",
                  "ExperienceConfig", "RetrievalSection", "EvalConfig")


def _sections(cfg: "RunConfig") -> list[tuple[str, Any]]:
    return [("", cfg)] + [(f.name + ".", getattr(cfg, f.name)) for f in fields(cfg)
                          if str(f.type) in _SECTION_TYPES]


def validate_config(cfg: "RunConfig", *, presets: Any) -> None:
    """Every check of :meth:`RunConfig.validate` that does not depend on the agent (``presets``:
    the preset names; the config passes them, so that this module needs nothing from it)."""
    # 1. types and numeric ranges, section by section (so the first error is the first field)
    for prefix, obj in _sections(cfg):
        if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
            raise ConfigError(f"{prefix.rstrip('.')}: must be a section of fields, got {obj!r}.")
        for f in fields(obj):
            value = getattr(obj, f.name)
            if str(f.type) in _SECTION_TYPES:
                continue  # checked as a section
            key = prefix + f.name
            choices = field_choices(obj, f.name)
            if choices is not None:
                if value not in choices:
                    names = [str(c) for c in choices]
                    raise ConfigError(
                        f"{key}={value!r}: must be one of {', '.join(names)}."
                        f"{_did_you_mean(value, names)} "
                        f"(e.g. --set {key}={getattr(type(obj)(), f.name)}).")
                continue
            _check_type(key, value, str(f.type))
            rng = FIELD_RANGES.get(key)
            if rng is not None and value is not None and value not in rng:
                default = getattr(type(obj)(), f.name) if prefix else getattr(type(cfg)(), f.name)
                raise ConfigError(f"{key}={value!r}: must be "
                                  f"{rng.describe(str(f.type).strip() == 'int')}; "
                                  f"{_fix(key, default)}.")
    if cfg.actor.logprob_temperature and not cfg.actor.recompute_old_logprobs:
        raise ConfigError(f"actor.logprob_temperature={cfg.actor.logprob_temperature} needs "
                          "actor.recompute_old_logprobs=true (the sampler recorded its log-probs "
                          "at the sampling temperature): --set actor.recompute_old_logprobs=true, "
                          "or --set actor.logprob_temperature=0.")
    r = cfg.rollout
    if r.groups * r.group_size > MAX_EPISODES_PER_STEP:
        raise ConfigError(
            f"rollout.groups x rollout.group_size = {r.groups} x {r.group_size} = "
            f"{r.groups * r.group_size} episodes per step, more than the maximum "
            f"{MAX_EPISODES_PER_STEP} (every episode holds a live env and its prompts). Use fewer "
            "groups or a smaller group_size.")
    for family, cap in r.env_max_steps.items():
        if not isinstance(family, str) or isinstance(cap, bool) or not isinstance(cap, int) \
                or cap not in ENV_MAX_STEPS_RANGE:
            raise ConfigError(f"rollout.env_max_steps[{family!r}]={cap!r}: must be an integer "
                              f">= 1 and <= {ENV_MAX_STEPS_RANGE.hi:g} (actions per episode), e.g. "
                              '--set rollout.env_max_steps=\'{"minihack": 10}\'.')
    for family, kwargs in r.env_kwargs.items():
        if not isinstance(family, str) or not isinstance(kwargs, dict) \
                or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"rollout.env_kwargs[{family!r}]={kwargs!r}: must map a family name "
                              "to a dict of gymnasium.make keyword arguments, e.g. --set "
                              '\'rollout.env_kwargs={"minihack": {"view": "compact"}}\'.')
        if "max_steps" in kwargs:
            raise ConfigError(f"rollout.env_kwargs[{family!r}] sets max_steps: use "
                              f"rollout.env_max_steps[{family!r}] for the action cap.")
        if family == "swe":  # checked now, before the run's folder is written
            from crl_bench.envs.swe.env import check_settings

            try:
                check_settings(**kwargs)
            except ValueError as exc:
                raise ConfigError(f"rollout.env_kwargs['swe']: {exc}") from None
    if r.prompt_layout == "official" and r.conversation != "full":
        raise ConfigError("rollout.prompt_layout=official is the official multi-turn chat: it "
                          "needs rollout.conversation=full (--set rollout.conversation=full).")
    # 2. names, against the registries
    from crl_bench.algorithms import ADVANTAGES, LOSSES, loss_arg_ranges
    from crl_bench.llm.backend import BACKENDS
    from crl_bench.registry import AGENTS, RegistryError

    if cfg.preset is not None and cfg.preset not in presets:
        _check_name("preset", cfg.preset, presets, "preset")
    _check_name("agent", cfg.agent, AGENTS.names(), "agent (`crl-bench list agents`)")
    try:  # loading the agent imports a plugin, which may register advantages or losses it uses
        agent = AGENTS.get(cfg.agent)
    except Exception as exc:  # noqa: BLE001 - a broken plugin is named, never hidden
        raise ConfigError(f"agent={cfg.agent!r} cannot be loaded: {exc}") from exc
    if not isinstance(cfg.method, dict):
        raise ConfigError(f"method={cfg.method!r}: must map the agent's option names to values.")
    try:  # the agent checks its own options (names, types, values)
        agent = agent.with_options(cfg.method) if hasattr(agent, "with_options") else agent
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_split(cfg, bool(getattr(agent, "split_groups", False)))
    try:
        from crl_bench.mixes import resolve_tasks

        resolved = resolve_tasks(cfg.tasks)
    except (RegistryError, ValueError) as exc:
        raise ConfigError(f"tasks={cfg.tasks!r}: {exc} (`crl-bench list mixes`, `crl-bench list "
                          "envs`)") from None
    names = [t.name for t in resolved]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"tasks={cfg.tasks!r}: {', '.join(repeated[:5])} listed more than once "
                          "(a task's records and columns are keyed by its name); name each task "
                          "once.")
    if len(resolved) > MAX_TASKS:
        raise ConfigError(f"tasks={cfg.tasks!r}: {len(resolved)} tasks, more than {MAX_TASKS} "
                          "(each holds envs and columns of its own); use a mix or fewer env ids.")
    check_model_name("model.actor", cfg.model.actor)
    if cfg.model.extractor is not None:
        check_model_name("model.extractor", cfg.model.extractor)
    _check_name("model.backend", cfg.model.backend, BACKENDS, "generation backend")
    if not _DEVICE_RE.match(cfg.model.device):
        raise ConfigError(f"model.device={cfg.model.device!r}: must be auto, cpu, mps, cuda or "
                          "cuda:N; e.g. --set model.device=cpu.")
    for role in ("actor", "extractor"):
        opt = getattr(cfg, role)
        _check_name(f"{role}.loss", opt.loss, LOSSES.names(), "policy loss")
        allowed = LOSSES.entry(opt.loss).metadata.get("defaults", {})
        for arg, value in opt.loss_args.items():
            key = f"{role}.loss_args.{arg}"
            if arg not in allowed:
                raise ConfigError(f"{key}: {arg!r} is not a setting of loss {opt.loss!r}; its "
                                  f"settings: {', '.join(sorted(allowed)) or '(none)'}.")
            if isinstance(allowed[arg], bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"{key}={value!r}: must be true or false.")
                continue
            if value is None and allowed[arg] is None:
                continue
            rng = loss_arg_ranges(opt.loss).get(arg, Range(-1e12, 1e12))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in rng:
                raise ConfigError(f"{key}={value!r}: must be {rng.describe(False)}; "
                                  f"{_fix(key, allowed[arg])}.")
    _check_name("actor.advantage", cfg.actor.advantage, ADVANTAGES.names(), "advantage estimator")
    if cfg.actor.sample_unit == "trajectory" and cfg.rollout.conversation != "full":
        raise ConfigError("actor.sample_unit=trajectory trains the whole conversation as one "
                          "sequence and needs rollout.conversation=full (--set "
                          "rollout.conversation=full), or use actor.sample_unit=turn.")
    one_base = not cfg.model.extractor or cfg.model.extractor == cfg.model.actor
    roles = tuple(getattr(agent, "roles", ("actor",)))  # asked of the agent, never its name
    own_weights = len(roles) > 1 and not getattr(agent, "shares_parameters", False)
    if cfg.model.lora_r == 0 and cfg.model.backend == "vllm" and one_base and own_weights:
        # one vLLM engine holds one set of full weights (docs/vllm.md)
        raise ConfigError(f"model.lora_r=0 (full fine-tuning) with the vllm backend needs one set "
                          f"of weights per model, and agent {cfg.agent!r} trains "
                          f"{' and '.join(roles)} apart: give the extractor its own base "
                          "(--set model.extractor=NAME, as the paper preset does), or use the hf "
                          "backend (--set model.backend=hf), or a LoRA rank > 0.")
    if cfg.model.backend == "vllm":
        # vLLM returns log-probs renormalised over the tokens top-k / top-p kept; the PPO / CISPO
        # ratio needs the untruncated ones (what the hf backend records), so the trainer must
        # recompute them (docs/vllm.md)
        for role, top_k, top_p in (("actor", cfg.rollout.top_k, cfg.rollout.top_p),
                                   ("extractor", cfg.extractor.top_k, cfg.extractor.top_p)):
            if (top_k > 0 or top_p < 1.0) and not getattr(cfg, role).recompute_old_logprobs:
                raise ConfigError(
                    f"model.backend=vllm with {role} sampling truncated (top_k={top_k}, "
                    f"top_p={top_p}): vLLM's log-probs are renormalised over the kept tokens, "
                    f"which biases the update's ratio. Use --set {role}.recompute_old_logprobs=true "
                    "(the paper preset does), or sample untruncated (top_k=0, top_p=1.0).")
    if cfg.experience.merge_scope == "key" and cfg.experience.key != "episode_start":
        raise ConfigError("experience.merge_scope=key merges entries that share a retrieval key, "
                          "but with experience.key=entry every entry is keyed by its own text, so "
                          "no two share one and nothing would merge. Use --set "
                          "experience.key=episode_start, or experience.merge_scope=family.")
    check_embedder_name("experience.embedder", cfg.experience.embedder)


def _check_split(cfg: "RunConfig", split: bool) -> None:
    """``split``: the agent splits each group into with/without-experience halves (K even, >= 4)."""
    k = cfg.rollout.group_size
    if split and k % 2:
        raise ConfigError(
            f"rollout.group_size={k} is odd but the experience split is on: half of each group "
            f"uses experience and half does not. Use an even K (e.g. --set "
            f"rollout.group_size={k + 1}) or switch the split off.")
    if split and k < 4:
        raise ConfigError(f"rollout.group_size={k}: with the experience split on each half needs "
                          ">= 2 rollouts for a non-zero advantage: use rollout.group_size >= 4.")
