"""WebShop's data: the catalogue, the instruction files, the goals and the search index.

A data folder holds, for the 1,000-product catalogue (the ``1k`` set, see
``../shared/data/webshop/README.md``):

* ``resources_1k_documents.jsonl.gz`` - one JSON object per product, ``{"id", "contents",
  "product"}``: exactly the documents WebShop indexes. ``product`` is the product as WebShop's
  ``load_products`` leaves it (``Title``, ``Price``, ``options``, ``Attributes``, ...), and
  ``contents`` the searchable text;
* ``items_ins_v2_1000.json`` - WebShop's synthetic instructions and attributes;
* ``items_human_ins_1000_subset.json`` - the human instructions for these products (only needed
  for human goals).

The ``full`` set (1.18M products) uses ``resources_documents.jsonl.gz``, ``items_ins_v2.json``
and ``items_human_ins.json``; ``python -m crl_bench.envs.webshop.download`` makes either set
from WebShop's own download (it needs the internet).

Everything is loaded once per process and folder (envs share it), and the BM25 index once per
documents file (cached on disk).
"""

from __future__ import annotations

import gzip
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl_bench.envs.webshop.goals import WebShopGoal, build_goals

FAMILY = "webshop"


@dataclass(frozen=True)
class CatalogueFiles:
    documents: str
    instructions: str
    human_instructions: str


CATALOGUES: dict[str, CatalogueFiles] = {
    "1k": CatalogueFiles("resources_1k_documents.jsonl.gz", "items_ins_v2_1000.json",
                         "items_human_ins_1000_subset.json"),
    "full": CatalogueFiles("resources_documents.jsonl.gz", "items_ins_v2.json",
                           "items_human_ins.json"),
}

DOWNLOAD_COMMAND = "python -m crl_bench.envs.webshop.download --size small --dest DIR"
DOWNLOAD_HINT = (f"`{DOWNLOAD_COMMAND}` (needs the internet and `pip install gdown`; "
                 "`--size full` for the 1.18M-product set)")


def required_files(catalogue: str, goal_source: str) -> tuple[str, ...]:
    """The files a data folder must hold for ``catalogue`` and ``goal_source``."""
    files = CATALOGUES[catalogue]
    if goal_source == "human":
        return files.documents, files.human_instructions
    return files.documents, files.instructions


def resolve_webshop_dir(data_dir: str | Path | None, catalogue: str = "1k",
                        goal_source: str = "synthetic") -> Path:
    """The WebShop data folder, or :class:`crl_bench.data.DataNotFoundError` naming
    ``CRL_BENCH_WEBSHOP_DATA`` and the download command."""
    from crl_bench.data import resolve_data_dir

    if catalogue not in CATALOGUES:
        raise ValueError(f"catalogue {catalogue!r} is unknown; use one of {sorted(CATALOGUES)}.")
    return resolve_data_dir(FAMILY, data_dir, required_files=required_files(catalogue, goal_source),
                            download_hint=DOWNLOAD_HINT)


def _read_json(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def read_documents(path: Path) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """(ids, contents, products) from a WebShop ``documents.jsonl[.gz]`` file."""
    ids: list[str] = []
    contents: list[str] = []
    products: list[dict[str, Any]] = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                ids.append(doc["id"])
                contents.append(doc["contents"])
                products.append(doc["product"])
            except (json.JSONDecodeError, KeyError) as exc:
                raise ValueError(f"{path}:{line_no} is not a WebShop document "
                                 f"({{'id', 'contents', 'product'}}): {exc}") from exc
    return ids, contents, products


@dataclass
class WebShopData:
    """One loaded catalogue: products, goals per source (lazy) and the search engine (lazy)."""

    folder: Path
    catalogue: str
    doc_ids: list[str]
    contents: list[str]
    products: list[dict[str, Any]]
    by_asin: dict[str, dict[str, Any]]
    _goals: dict[str, tuple[list[WebShopGoal], dict[str, float]]] = field(default_factory=dict)
    _search: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def goals(self, source: str) -> list[WebShopGoal]:
        return self._goals_and_prices(source)[0]

    def prices(self, source: str) -> dict[str, float]:
        """ASIN -> price (dollars) drawn with the goals of ``source`` (same seed stream)."""
        return self._goals_and_prices(source)[1]

    def _goals_and_prices(self, source: str) -> tuple[list[WebShopGoal], dict[str, float]]:
        with self._lock:
            if source not in self._goals:
                files = CATALOGUES[self.catalogue]
                if source == "human":
                    path = self.folder / files.human_instructions
                    if not path.exists():
                        raise FileNotFoundError(f"human goals need {path}; see {DOWNLOAD_HINT}")
                    self._goals[source] = build_goals(self.products, source="human",
                                                      human_instructions=_read_json(path))
                else:
                    self._goals[source] = build_goals(
                        self.products, source=source,
                        instructions=_read_json(self.folder / files.instructions))
            return self._goals[source]

    @property
    def search(self) -> Any:
        """The :class:`~crl_bench.envs.webshop.search.ProductSearch` (built or loaded once)."""
        with self._lock:
            if self._search is None:
                from crl_bench.data import cache_dir
                from crl_bench.envs.webshop.search import ProductSearch

                self._search = ProductSearch(self.doc_ids, self.contents,
                                             cache_root=cache_dir() / FAMILY)
            return self._search


_LOADED: dict[tuple[str, str], WebShopData] = {}
_LOADED_LOCK = threading.Lock()


def load_webshop_data(data_dir: str | Path | None = None, catalogue: str = "1k",
                      goal_source: str = "synthetic") -> WebShopData:
    """Load (once per process) the catalogue in the resolved data folder."""
    folder = resolve_webshop_dir(data_dir, catalogue, goal_source)
    key = (str(folder.resolve()), catalogue)
    with _LOADED_LOCK:
        if key not in _LOADED:
            ids, contents, products = read_documents(folder / CATALOGUES[catalogue].documents)
            by_asin = {p["asin"]: p for p in products}
            _LOADED[key] = WebShopData(folder=folder, catalogue=catalogue, doc_ids=ids,
                                       contents=contents, products=products, by_asin=by_asin)
        return _LOADED[key]

