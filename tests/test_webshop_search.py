"""WebShop's BM25 search: the analyzer, Lucene's length code, the index cache, and agreement with
result pages recorded from real WebShop (pyserini/Lucene) runs on the 1,000-product catalogue."""

from __future__ import annotations

import pytest

from _data_paths import missing_data_reason, shared_data_dir
from crl_bench.envs.webshop.search import Analyzer, ProductSearch, lucene_length

DATA = shared_data_dir("webshop")
needs_data = pytest.mark.skipif(DATA is None, reason=missing_data_reason("webshop"))


def test_analyzer_tokens_follow_lucene_standard_tokenizer_and_stop_words():
    tokens = Analyzer().tokens("Men's 3.5 oz, 1,000 e.g. Description:Solid of the x-large don’t")
    assert tokens == ["men", "3.5", "oz", "1,000", "e.g", "description:solid", "x", "large", "don’t"]


def test_analyzer_emoji_and_han_characters_are_tokens_of_their_own():
    assert Analyzer().tokens("❤️ ✔fabric 锅巴") == ["❤️", "✔", "fabric", "锅", "巴"]


def test_analyzer_stems_with_porter():
    assert Analyzer()("running tables generously dresses") == ["run", "tabl", "gener", "dress"]


def test_analyzer_cuts_very_long_tokens_like_lucene():
    assert [len(t) for t in Analyzer().tokens("y" * 600)] == [255, 255, 90]


@pytest.mark.parametrize("length, stored", [(0, 0), (23, 23), (24, 24), (40, 40), (41, 40),
                                            (100, 96), (1000, 984)])
def test_lucene_length_code(length, stored):
    # 100: 100 - 24 = 76 = 0b1001100 keeps its top 4 bits 0b1001000 = 72 -> 96
    assert lucene_length(length) == stored


def test_bm25_scores_by_hand_and_index_cache(tmp_path):
    docs = ["red shoe", "blue shoe shoe", "green hat"]
    search = ProductSearch(["A", "B", "C"], docs, cache_root=tmp_path)
    assert not search.loaded_from_cache
    # "shoe": N=3, df=2 -> idf = ln(1 + 1.5/2.5) = ln 1.6; avgdl = 7/3
    # doc A (dl 2, tf 1): idf - idf / (1 + 1 / (0.9 * (0.6 + 0.4 * 2 / (7/3))))
    import math

    idf = math.log(1.6)
    def part(tf, dl):
        return idf - idf / (1 + tf / (0.9 * (0.6 + 0.4 * dl / (7 / 3))))
    scores = search.scores("shoes")
    assert scores[0] == pytest.approx(part(1, 2), rel=1e-6)
    assert scores[1] == pytest.approx(part(2, 3), rel=1e-6)
    assert scores[2] == 0.0
    assert search.search("shoes") == ["B", "A"]
    assert search.search("the") == []  # only a stop word: no hits, as in Lucene
    again = ProductSearch(["A", "B", "C"], docs, cache_root=tmp_path)
    assert again.loaded_from_cache and again.search("shoes") == ["B", "A"]
    changed = ProductSearch(["A", "B", "C"], docs[:2] + ["shoe rack"], cache_root=tmp_path)
    assert not changed.loaded_from_cache  # other documents, other cache entry


def test_ties_keep_catalogue_order():
    search = ProductSearch(["A", "B", "C"], ["tea cup", "coffee", "tea cup"])
    assert search.search("tea") == ["A", "C"]


# Result pages shown by real WebShop runs (recorded in public agent logs): query -> {rank: ASINs}.
RECORDED_PAGES = {
    "eco friendly fleece throw blanket tortoisegoo9511 39x49in under 60": {
        0: "B09DG3YTHY B0836D6CW4 B09KTB1VG6 B08FGWZZ8J B08SKH3LTM B07SXRVKZ2 B09BNCFGLY "
           "B09C1YWG8W B08WKMHTGH B09MYFGDY5".split()},
    "tempered glass screen protector under $40": {
        0: "B083ZK4NRS B088LZPNG6 B095PF5BXT B07YCGBPRD B07ZYVWCZ7 B07JMXLXNY B0982W8RKZ "
           "B07GZLDJMC B083HXHG75 B08CV7M1HV".split()},
    "men's sweater polyester cotton 5x-large under $60 machine wash": {
        0: ["B09PBPZ24Z", "B09QQP3356"], 10: ["B09ND8P2QR", "B09ND9DP7J"],
        20: ["B09P7H5YK7", "B07JVVDJ6L", "B09P39QN2W"],
        30: "B07FD13LP1 B09J95S478 B09476F64C B09T756KQ5 B09GVJBPRR B09QCVCYVY B085WQKRRJ "
            "B09R9YCM6R B09HGFV91W B07WX8FPGG".split()},
    "men sweater polyester cotton machine wash cold tumble dry 5x-large": {
        0: ["B01HQTWL6S", "B09Q8RD8YN", "B09M63B87V"], 10: ["B09HY9XB8P", "B09QQP3356"]},
}


@needs_data
@pytest.mark.parametrize("query", sorted(RECORDED_PAGES))
def test_search_matches_recorded_webshop_result_pages(query):
    from crl_bench.envs.webshop.data import load_webshop_data

    results = load_webshop_data(str(DATA)).search.search(query)
    assert len(results) == 50
    for rank, asins in RECORDED_PAGES[query].items():
        assert results[rank:rank + len(asins)] == asins
