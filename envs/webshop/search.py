"""WebShop's product search: BM25 over the product documents, with ``bm25s`` instead of Lucene.

WebShop indexes one document per product (``contents`` = lower-cased title, description, first
bullet point and option text) with pyserini/Anserini, and answers ``search[...]`` with the top 50
BM25 hits (k1 = 0.9, b = 0.4, Anserini's defaults). We index the very same ``contents`` strings
(``resources_1k_documents.jsonl.gz``) with the same parameters and Lucene's BM25 formula
(``bm25s`` method ``"lucene"``), after an analyzer written to behave like Anserini's default
English analyzer:

* tokens as Lucene's ``StandardTokenizer`` (Unicode word breaks) forms them: runs of letters,
  digits and ``_``, kept whole across ``:``, ``.``, ``'`` between letters ("description:solid")
  and ``.``, ``,``, ``;``, ``'`` between digits ("3.5", "1,000"); tokens over 255 characters are
  cut in 255-character pieces;
* possessive ``'s`` removed, lower-cased, Lucene's 33 English stop words removed;
* Porter stemming (PyStemmer's ``porter`` algorithm, the original Porter stemmer).

Known differences from Lucene: Lucene stores document lengths in a lossy one-byte code (lengths
above ~40 tokens are rounded by up to ~6%), which we do not reproduce, so documents with nearly
equal scores may swap places; scripts outside Latin letters are not split per character. Ties
are broken by catalogue order, as Lucene breaks them by document id. Queries keep at most 1,024
terms (Lucene's clause limit, where it would raise instead).

The index is built once per documents file and cached under ``crl_bench.data.cache_dir()``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ANALYZER_VERSION = "lucene-standard-english-porter-1"
BM25_K1 = 0.9
BM25_B = 0.4
RESULTS_PER_SEARCH = 50
MAX_QUERY_TERMS = 1024
MAX_TOKEN_CHARS = 255

LUCENE_ENGLISH_STOP_WORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
})

_LETTER = r"[^\W\d_]"
_TOKEN = re.compile(
    r"\w+(?:(?:(?<=" + _LETTER + r")[:.'\u2019](?=" + _LETTER + r")"
    r"|(?<=\d)[.,;'\u2019](?=\d))\w+)*")


def _stemmer() -> Any:
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("porter")


class Analyzer:
    """Text -> index terms, in the manner of Anserini's default English analyzer."""

    def __init__(self) -> None:
        self._stem = _stemmer().stemWords

    def tokens(self, text: str) -> list[str]:
        """Lower-cased tokens after possessive and stop-word removal, before stemming."""
        out: list[str] = []
        for raw in _TOKEN.findall(text):
            token = raw.lower()
            if token.endswith(("'s", "\u2019s")):
                token = token[:-2]
            if not token or token in LUCENE_ENGLISH_STOP_WORDS:
                continue
            if len(token) > MAX_TOKEN_CHARS:
                out.extend(token[i:i + MAX_TOKEN_CHARS] for i in range(0, len(token), MAX_TOKEN_CHARS))
            else:
                out.append(token)
        return out

    def __call__(self, text: str) -> list[str]:
        return self._stem(self.tokens(text))


def documents_fingerprint(contents: Sequence[str]) -> str:
    """A short hash of the documents, the analyzer and the BM25 parameters (the cache key)."""
    digest = hashlib.sha256()
    digest.update(f"{ANALYZER_VERSION}|k1={BM25_K1}|b={BM25_B}|n={len(contents)}".encode())
    for text in contents:
        digest.update(b"\x00")
        digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:20]


class ProductSearch:
    """BM25 search over the product documents.

    Args:
        doc_ids: the ASIN of each document, in catalogue order.
        contents: the text WebShop indexed for each document.
        cache_root: where the built index is kept (``<cache_root>/bm25-<fingerprint>``);
            ``None`` builds it in memory only.
    """

    def __init__(self, doc_ids: Sequence[str], contents: Sequence[str],
                 cache_root: str | os.PathLike[str] | None = None) -> None:
        if len(doc_ids) != len(contents):
            raise ValueError(f"{len(doc_ids)} ids but {len(contents)} documents")
        self.doc_ids = list(doc_ids)
        self.analyzer = Analyzer()
        self.fingerprint = documents_fingerprint(contents)
        self.index_dir = Path(cache_root) / f"bm25-{self.fingerprint}" if cache_root else None
        self.loaded_from_cache = False
        self._bm25 = self._load_or_build(contents)
        self._vocab: dict[str, int] = self._bm25.vocab_dict

    def _load_or_build(self, contents: Sequence[str]) -> Any:
        import bm25s

        if self.index_dir is not None and (self.index_dir / "params.index.json").exists():
            try:
                index = bm25s.BM25.load(str(self.index_dir), load_corpus=False, show_progress=False)
                if index.scores["num_docs"] == len(self.doc_ids):
                    self.loaded_from_cache = True
                    return index
            except Exception:  # a damaged cache is rebuilt, never trusted
                pass
        index = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
        index.index([self.analyzer(text) for text in contents], show_progress=False)
        if self.index_dir is not None:
            self._save(index)
        return index

    def _save(self, index: Any) -> None:
        assert self.index_dir is not None
        self.index_dir.parent.mkdir(parents=True, exist_ok=True)
        # Write beside the final place, then rename: a concurrent reader never sees half a cache.
        tmp = Path(tempfile.mkdtemp(prefix=".bm25-tmp-", dir=self.index_dir.parent))
        try:
            index.save(str(tmp), show_progress=False)
            try:
                os.rename(tmp, self.index_dir)
            except OSError:  # another process finished first; its copy is as good as ours
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def query_terms(self, query: str) -> list[int]:
        """Vocabulary ids of the query's terms (unknown terms dropped, at most 1,024 kept)."""
        terms = self.analyzer(query)[:MAX_QUERY_TERMS]
        return [self._vocab[t] for t in terms if t in self._vocab]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query``; shape (n_documents,), float32."""
        ids = self.query_terms(query)
        if not ids:
            return np.zeros(len(self.doc_ids), dtype=np.float32)
        return self._bm25.get_scores_from_ids(ids)

    def search(self, query: str, k: int = RESULTS_PER_SEARCH) -> list[str]:
        """ASINs of the ``k`` best-matching documents, best first (documents that match no term
        are never returned, as in Lucene)."""
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.doc_ids[i] for i in order if scores[i] > 0.0]
