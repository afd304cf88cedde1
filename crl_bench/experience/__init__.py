"""The experience system: a persistent bank (SQLite + hnswlib), the embedder and the
ExperienceManager hub (retrieval, the bank's writes and outcome ledger). The extractor that
writes to it (extraction, Search-and-Ask, merge, its training track) is ``crl_bench.extractor``.

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
    "Operation": "manager",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crl_bench.experience' has no attribute {name!r}")
    return getattr(importlib.import_module(f"crl_bench.experience.{module}"), name)
