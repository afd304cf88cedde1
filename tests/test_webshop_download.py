"""The conversion behind ``python -m crl_bench.envs.webshop.download`` (the download itself needs
the internet and is never run here): WebShop's product preparation and index documents."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from _data_paths import missing_data_reason, shared_data_dir
from crl_bench.envs.webshop.download import parse_pricing, product_document, webshop_products

DATA = shared_data_dir("webshop")


@pytest.mark.parametrize("text, values, tag", [
    ("$877.80", [877.8], "$877.8"),
    ("$19.99 - $27.99", [19.99, 27.99], "$19.99 to $27.99"),
    ("$1,049.00", [1049.0], "$1049.0"),
    ("$1.00 - $2.00 - $3.00", [1.0, 2.0], "$1.0 to $2.0"),
    ("", [100.0], "$100.0"),
    (None, [100.0], "$100.0"),
])
def test_parse_pricing_like_webshop(text, values, tag):
    assert parse_pricing(text) == (values, tag)


def test_products_keep_webshop_fields_and_skip_bad_asins():
    raw = [
        {"name": "Red Mug", "full_description": "A mug.", "pricing": "$5.00",
         "images": ["img1"], "product_category": "Home › Kitchen", "small_description": "Holds tea",
         "customization_options": {"Color": [{"value": "Dark/Red ", "image": "i"}],
                                   "Size": None},
         "asin": "B000000001", "category": "garden", "query": " Mugs ", "brand": "x"},
        {"name": "dup", "asin": "B000000001"},
        {"name": "bad", "asin": "nan"},
    ]
    [p] = webshop_products(raw, {"B000000001": {"attributes": ["dishwasher safe"]}})
    assert "brand" not in p
    assert p["BulletPoints"] == ["Holds tea"] and p["Price"] == "$5.0"
    assert p["options"] == {"color": ["dark | red"]} and p["option_to_image"] == {"dark | red": "i"}
    assert p["Attributes"] == ["dishwasher safe"] and p["query"] == "mugs"
    assert (p["Reviews"], p["Rating"], p["MainImage"]) == ([], "N.A.", "img1")
    doc = product_document(p)
    assert doc["contents"] == "red mug a mug. holds tea color: dark | red"


@pytest.mark.skipif(DATA is None, reason=missing_data_reason("webshop"))
def test_conversion_reproduces_the_indexed_documents_byte_for_byte():
    with gzip.open(DATA / "items_shuffle_1000.json.gz", "rt", encoding="utf-8") as f:
        raw = json.load(f)
    with open(DATA / "items_ins_v2_1000.json", encoding="utf-8") as f:
        attributes = json.load(f)
    with open(DATA / "items_human_ins_1000_subset.json", encoding="utf-8") as f:
        human = json.load(f)
    ours = [json.dumps(product_document(p)) for p in webshop_products(raw, attributes, human)]
    with gzip.open(DATA / "resources_1k_documents.jsonl.gz", "rt", encoding="utf-8") as f:
        indexed = [line.rstrip("\n") for line in f]
    assert ours == indexed


def test_download_command_help_runs_offline():
    out = subprocess.run([sys.executable, "-m", "crl_bench.envs.webshop.download", "--help"],
                         capture_output=True, text=True, check=True)
    assert "--size {full,small}" in out.stdout
