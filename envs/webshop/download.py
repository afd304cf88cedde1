"""WebShop's own data download (for users with the internet), turned into our data folder.

    python -m crl_bench.envs.webshop.download --size small            # 1,000 products
    python -m crl_bench.envs.webshop.download --size full --dest DIR  # 1.18M products

This fetches the files WebShop's ``setup.sh`` fetches from Google Drive (with ``gdown``, which
``pip install gdown`` provides) and converts them the way WebShop prepares its search index:

1. ``webshop_products`` - WebShop's ``load_products``: drop the keys WebShop never reads, add
   ``Title``, ``Description``, ``BulletPoints``, parsed ``pricing`` / ``Price``, ``options`` (names
   and values lower-cased, "/" written " | "), ``Attributes`` from ``items_ins_v2``, the human
   ``instructions``, ``MainImage``; skip ASINs that are "nan", longer than 10 characters or
   repeated;
2. ``product_document`` - WebShop's ``convert_product_file_format.py``: ``{"id", "contents",
   "product"}`` with ``contents`` = lower-cased title, description, first bullet point and option
   text;
3. write ``resources_1k_documents.jsonl.gz`` + ``items_ins_v2_1000.json`` +
   ``items_human_ins_1000_subset.json`` (``small``), or ``resources_documents.jsonl.gz`` +
   ``items_ins_v2.json`` + ``items_human_ins.json`` (``full``).

The default destination is the cache folder the env looks in (``crl_bench.data``), so after the
download ``gymnasium.make("crl/WebShop-v0")`` finds it. Nothing here runs in the tests except
the conversion, which is checked against the shipped 1k documents.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from crl_bench.envs.webshop.data import CATALOGUES, FAMILY

# Google Drive file ids from WebShop's setup.sh.
DRIVE_FILES: dict[str, dict[str, str]] = {
    "small": {"items_shuffle_1000.json": "1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib",
              "items_ins_v2_1000.json": "1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu"},
    "full": {"items_shuffle.json": "1A2whVgOO0euk5O13n2iYDM0bQRkkRduB",
             "items_ins_v2.json": "1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi"},
    "human": {"items_human_ins.json": "14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O"},
}
SIZE_TO_CATALOGUE = {"small": "1k", "full": "full"}

# Keys of the scraped products that WebShop deletes before indexing.
UNUSED_KEYS: tuple[str, ...] = (
    "product_information", "brand", "brand_url", "list_price", "availability_quantity",
    "availability_status", "total_reviews", "total_answered_questions", "seller_id",
    "seller_name", "fulfilled_by_amazon", "fast_track_message", "aplus_present",
    "small_description_old",
)


def parse_pricing(pricing: str | None) -> tuple[list[float], str]:
    """WebShop's price parsing: ``"$19.99 - $27.99"`` -> ``([19.99, 27.99], "$19.99 to $27.99")``.

    A missing price becomes ``([100.0], "$100.0")``; more than two values keep the first two.
    """
    if not pricing:
        return [100.0], "$100.0"
    values = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in pricing.split("$")[1:]]
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def webshop_products(raw_products: Iterable[dict[str, Any]], attributes: Mapping[str, Any],
                     human_instructions: Mapping[str, Any] | None = None,
                     reviews: Mapping[str, tuple[list[Any], Any]] | None = None,
                     limit: int | None = None) -> list[dict[str, Any]]:
    """The products as WebShop's ``load_products`` leaves them (dicts are modified in place).

    Args:
        raw_products: the scraped products (``items_shuffle*.json``), in file order.
        attributes: ``items_ins_v2*.json`` (ASIN -> ``{"attributes", ...}``).
        human_instructions: ``items_human_ins.json`` (ASIN -> instructions), copied into each
            product as ``instructions`` (WebShop's index was built this way).
        reviews: ASIN -> (reviews, average rating), when a reviews file exists; otherwise every
            product has no reviews and rating "N.A.", as in the published index.
        limit: keep only the first ``limit`` raw products (WebShop's ``num_products``).
    """
    products: list[dict[str, Any]] = []
    seen: set[str] = set()
    for count, p in enumerate(raw_products):
        if limit is not None and count >= limit:
            break
        for key in UNUSED_KEYS:
            p.pop(key, None)
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        p["Title"] = p["name"]
        p["Description"] = p["full_description"]
        review_list, rating = (reviews or {}).get(asin, ([], "N.A."))
        p["Reviews"] = review_list
        p["Rating"] = rating
        small = p["small_description"]
        p["BulletPoints"] = small if isinstance(small, list) else [small]
        p["pricing"], p["Price"] = parse_pricing(p.get("pricing"))
        options: dict[str, list[str]] = {}
        option_to_image: dict[str, Any] = {}
        for name, contents in (p["customization_options"] or {}).items():
            if contents is None:
                continue
            values = []
            for content in contents:
                value = content["value"].strip().replace("/", " | ").lower()
                values.append(value)
                option_to_image[value] = content.get("image", None)
            options[name.lower()] = values
        p["options"] = options
        p["option_to_image"] = option_to_image
        entry = attributes.get(asin, {})
        p["Attributes"] = entry["attributes"] if "attributes" in entry else ["DUMMY_ATTR"]
        if human_instructions is not None and asin in human_instructions:
            p["instructions"] = human_instructions[asin]
        p["MainImage"] = p["images"][0]
        p["query"] = p["query"].lower().strip()
        products.append(p)
    return products


def product_document(product: Mapping[str, Any]) -> dict[str, Any]:
    """The search document WebShop indexes for one product."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}"
                                for name, values in product.get("options", {}).items())
    contents = " ".join([product["Title"], product["Description"], product["BulletPoints"][0],
                         option_text]).lower()
    return {"id": product["asin"], "contents": contents, "product": product}


def write_documents(path: Path, products: Sequence[Mapping[str, Any]]) -> None:
    """``documents.jsonl.gz``: one ``json.dumps`` line per product (gzip mtime 0, reproducible)."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        for product in products:
            f.write((json.dumps(product_document(product)) + "\n").encode("utf-8"))


def _gdown(file_id: str, target: Path) -> None:
    try:
        import gdown
    except ImportError:
        raise SystemExit("Downloading WebShop's data needs gdown: `pip install gdown`.") from None
    if gdown.download(id=file_id, output=str(target), quiet=False) is None:
        raise SystemExit(f"Download of {target.name} (Google Drive id {file_id}) failed; check "
                         "your connection, or fetch it by hand into the same folder.")


def download_webshop(dest: str | Path | None = None, size: str = "small",
                     keep_raw: bool = False) -> Path:
    """Download WebShop's ``small`` or ``full`` set and write our data folder; returns it."""
    if size not in SIZE_TO_CATALOGUE:
        raise ValueError(f"size {size!r} is unknown; use 'small' or 'full'.")
    if dest is None:
        from crl_bench.data import cache_dir

        dest = cache_dir() / "data" / FAMILY
    folder = Path(dest).expanduser()
    raw_dir = folder / "webshop_raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    for name, file_id in {**DRIVE_FILES[size], **DRIVE_FILES["human"]}.items():
        if not (raw_dir / name).exists():
            _gdown(file_id, raw_dir / name)
    products_file, attributes_file = DRIVE_FILES[size]
    with open(raw_dir / attributes_file, encoding="utf-8") as f:
        attributes = json.load(f)
    with open(raw_dir / "items_human_ins.json", encoding="utf-8") as f:
        human = json.load(f)
    with open(raw_dir / products_file, encoding="utf-8") as f:
        products = webshop_products(json.load(f), attributes, human)
    files = CATALOGUES[SIZE_TO_CATALOGUE[size]]
    write_documents(folder / files.documents, products)
    with open(folder / files.instructions, "w", encoding="utf-8") as f:
        json.dump(attributes, f)
    asins = {p["asin"] for p in products}
    with open(folder / files.human_instructions, "w", encoding="utf-8") as f:
        json.dump({a: v for a, v in human.items() if a in asins}, f)
    if not keep_raw:
        for name in (*DRIVE_FILES[size], *DRIVE_FILES["human"]):
            (raw_dir / name).unlink(missing_ok=True)
        if not any(raw_dir.iterdir()):
            raw_dir.rmdir()
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crl_bench.envs.webshop.download",
        description="Download WebShop's product data (needs the internet and gdown) and write a "
                    "crl-bench WebShop data folder.")
    parser.add_argument("--size", choices=sorted(SIZE_TO_CATALOGUE), default="small",
                        help="small: 1,000 products (default); full: 1.18M products")
    parser.add_argument("--dest", help="data folder to write (default: crl-bench's cache, where "
                                       "the env looks)")
    parser.add_argument("--keep-raw", action="store_true", help="keep WebShop's original files")
    args = parser.parse_args(argv)
    folder = download_webshop(args.dest, args.size, args.keep_raw)
    print(f"WebShop {args.size} data written to {folder}. Use it with data_dir={folder} or "
          f"CRL_BENCH_WEBSHOP_DATA={folder}" + (
              ", and catalogue='full'." if args.size == "full" else "."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
