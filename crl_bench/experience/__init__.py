"""The experience system: a persistent bank (SQLite + hnswlib), the embedder, the
ExperienceManager hub (retrieval, extractor operations, merge) and Search-and-Ask.

Names are loaded on first use so that ``import crl_bench.experience`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ExperienceBank": "bank", "ExperienceEntry": "bank", "BankCompatibilityError": "bank",
    "StaleEntriesError": "bank", "IndexConfig": "ann", "read_meta": "bank",
    "Embedder": "embedder", "SentenceTransformerEmbedder": "embedder", "load_embedder": "embedder",
    "ExperienceManager": "manager", "RetrievalConfig": "manager",
    "diversified_order": "manager",
    "Operation": "extraction", "build_extraction_messages": "extraction",
    "parse_operations": "extraction", "trajectory_to_text": "extraction",
    "render_experience_block": "extraction", "strip_experience_block": "extraction",
    "usage_reward": "extraction",
    "MergeResult": "merging", "MergeSample": "merging",
    "SearchAndAsk": "search_ask", "EpisodeContext": "search_ask",
    "ScriptedGenerator": "scripted", "TextGeneration": "scripted",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crl_bench.experience' has no attribute {name!r}")
    return getattr(importlib.import_module(f"crl_bench.experience.{module}"), name)
