"""WebShop's product search: BM25 over the product documents, with ``bm25s`` instead of Lucene.

WebShop indexes one document per product (``contents`` = lower-cased title, description, first
bullet point and option text) with pyserini/Anserini, and answers ``search[...]`` with the top 50
BM25 hits (k1 = 0.9, b = 0.4, Anserini's defaults). We index the very same ``contents`` strings
(``resources_1k_documents.jsonl.gz``) with the same parameters and Lucene's BM25 formula, after
an analyzer written to behave like Anserini's default English analyzer:

* tokens as Lucene's ``StandardTokenizer`` (Unicode word breaks) forms them: runs of letters,
  digits and ``_``, kept whole across ``:``, ``.``, ``'`` between letters ("description:solid")
  and ``.``, ``,``, ``;``, ``'`` between digits ("3.5", "1,000"); each emoji (pictograph, with
  its variation selector and ZWJ sequence) and each Han or Hiragana character is a token of its
  own; tokens over 255 characters are cut in 255-character pieces;
* possessive ``'s`` removed, lower-cased, Lucene's 33 English stop words removed;
* Porter stemming (PyStemmer's ``porter`` algorithm, the original Porter stemmer).

Scores follow Lucene 9 exactly, including its lossy one-byte code for document lengths (lengths
above 40 tokens are rounded down to 4 significant bits, ``SmallFloat.intToByte4``): the index is
built by :class:`LuceneBM25`, a ``bm25s.BM25`` whose index-building step uses the decoded
lengths. Ties are broken by catalogue order, as Lucene breaks them by document id. A query keeps
at most 1,024 terms (Lucene's clause limit, where Lucene would raise instead).

On the result pages recorded from real WebShop runs that we could find (four queries, 42 ranked
ASINs on six result pages), this search returns the same products in the same order (``tests/test_webshop_search.py``).

The index is built once per documents file and cached under ``crl_bench.data.cache_dir()``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ANALYZER_VERSION = "lucene-standard-english-porter-2"
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

# Word characters, minus the scripts StandardTokenizer emits one character at a time.
_WORD = r"[\w--[\p{Han}\p{Hiragana}]]"
_LETTER = r"[\p{Alphabetic}--[\p{Han}\p{Hiragana}]]"
_TOKEN_PATTERN = (
    _WORD + r"+(?:(?:(?<=" + _LETTER + r")[:.'\u2019](?=" + _LETTER + r")"
    r"|(?<=\d)[.,;'\u2019](?=\d))" + _WORD + r"+)*"
    r"|[\p{Han}\p{Hiragana}]"
    r"|\p{Extended_Pictographic}\uFE0F?(?:\u200D\p{Extended_Pictographic}\uFE0F?)*"
    r"|\p{Regional_Indicator}{2}"
)


def lucene_length(length: int) -> int:
    """A document length as Lucene stores it: encoded to one byte and decoded again.

    Lengths below 24 are exact; above, ``24 + (length - 24)`` keeps its 4 highest bits
    (``SmallFloat.intToByte4`` then ``byte4ToInt``): 41 -> 40, 100 -> 96, 1000 -> 984.
    """
    free = 24
    if length < free:
        return length
    rest = length - free
    shift = max(rest.bit_length() - 4, 0)
    return free + ((rest >> shift) << shift)


class Analyzer:
    """Text -> index terms, in the manner of Anserini's default English analyzer."""

    def __init__(self) -> None:
        import regex
        import Stemmer  # PyStemmer

        self._token = regex.compile(_TOKEN_PATTERN, regex.V1)
        self._stem = Stemmer.Stemmer("porter").stemWords

    def tokens(self, text: str) -> list[str]:
        """Lower-cased tokens after possessive and stop-word removal, before stemming."""
        out: list[str] = []
        for raw in self._token.findall(text):
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


def _lucene_bm25_class() -> type:
    import bm25s

    class LuceneBM25(bm25s.BM25):
        """``bm25s.BM25`` scoring as Lucene 9's ``BM25Similarity`` does.

        Per (term, document): ``idf - idf / (1 + tf / (k1 * (1 - b + b * dl / avgdl)))`` with
        ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``, ``avgdl`` the true mean length and ``dl``
        the document length after Lucene's one-byte code (:func:`lucene_length`); float32.
        """

        def build_index_from_ids(self, unique_token_ids: list[int],
                                 corpus_token_ids: list[list[int]], show_progress: bool = True,
                                 leave_progress: bool = False) -> dict[str, Any]:
            import scipy.sparse as sp

            n_docs, n_vocab = len(corpus_token_ids), len(unique_token_ids)
            rows: list[int] = []
            cols: list[int] = []
            freqs: list[int] = []
            lengths = np.zeros(n_docs, dtype=np.int64)
            for doc, ids in enumerate(corpus_token_ids):
                lengths[doc] = len(ids)
                for term, tf in Counter(ids).items():
                    rows.append(doc)
                    cols.append(term)
                    freqs.append(tf)
            row = np.asarray(rows, dtype=np.int64)
            col = np.asarray(cols, dtype=np.int64)
            tf = np.asarray(freqs, dtype=np.float32)
            df = np.bincount(col, minlength=n_vocab).astype(np.float64)
            idf = np.log1p((n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
            avgdl = np.float32(lengths.sum() / max(n_docs, 1))
            dl = np.asarray([lucene_length(int(n)) for n in lengths], dtype=np.float32)
            norm_inverse = (np.float32(1) / (np.float32(self.k1) * (np.float32(1 - self.b)
                            + np.float32(self.b) * dl / avgdl))).astype(np.float32)
            weight = idf[col]
            score = weight - weight / (np.float32(1) + tf * norm_inverse[row])
            matrix = sp.csc_matrix((score.astype(np.float32), (row, col)), shape=(n_docs, n_vocab),
                                   dtype=np.float32)
            self.nonoccurrence_array = None
            return {"data": matrix.data, "indices": matrix.indices.astype(np.int32),
                    "indptr": matrix.indptr.astype(np.int32), "num_docs": n_docs}

    return LuceneBM25


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
        index = _lucene_bm25_class()(k1=BM25_K1, b=BM25_B, method="lucene")
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
        order = order[scores[order] > 0.0]
        return [self.doc_ids[i] for i in order.tolist()]
