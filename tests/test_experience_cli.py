"""``crl-bench bank stats|show|search PATH`` on a real bank written with the real embedder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crl_bench.cli import main
from crl_bench.experience.bank import ExperienceBank
from crl_bench.experience.embedder import load_embedder
from crl_bench.experience.manager import Operation
from crl_bench.experience.manager import ExperienceManager, RetrievalConfig


def limit_torch_threads() -> None:
    """One torch thread: on a shared 2-core CI machine two OpenMP threads spin against each
    other and run the embedder several times slower."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def bank_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "experience.sqlite"
    limit_torch_threads()
    embedder = load_embedder()
    with ExperienceBank(path, dim=embedder.dim, embedder_name=embedder.name) as bank:
        m = ExperienceManager(bank, embedder, RetrievalConfig(diversify=False))
        m.apply_operations([Operation("add", "Find the stairs", "Walk to '>' on the map."),
                            Operation("add", "Avoid monsters", "Step away from approaching "
                                                               "letters.")],
                           family="minihack", task_id="room-5x5",
                           provenance={"run": "run-1", "trajectories": ["t1"]}, step=3)
        m.apply_operations([Operation("add", "Cheapest match", "Buy the cheapest product with "
                                                               "all requested attributes.")],
                           family="webshop", task_id="ws-1", provenance={}, step=4)
        m.retrieve(["where are the stairs"])
        m.record_outcomes([1], 1.0)
    return path


def test_stats(bank_path, capsys):
    assert main(["bank", "stats", str(bank_path), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "entries       3" in out and "all-MiniLM-L6-v2 (dim 384)" in out
    assert "minihack    2" in out and "webshop     1" in out
    assert "retrievals    1" in out and "mean outcome +1.000" in out
    assert "ok: table and index agree" in out
    assert main(["bank", "stats", str(bank_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 3 and info["families"] == {"minihack": 2, "webshop": 1}
    assert info["top_retrieved"][0]["title"] == "Find the stairs"


def test_show(bank_path, capsys):
    assert main(["bank", "show", str(bank_path), "--family", "minihack"]) == 0
    out = capsys.readouterr().out
    assert "#1 [minihack] Find the stairs" in out and "Walk to '>' on the map." in out
    assert "retrieved 1x" in out and "mean outcome +1.00 over 1 uses" in out
    assert "tasks room-5x5; run run-1" in out and "Cheapest" not in out
    assert main(["bank", "show", str(bank_path), "--id", "3", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["title"] == "Cheapest match" and row["family"] == "webshop"


def test_search(bank_path, capsys):
    assert main(["bank", "search", str(bank_path), "which shirt should I buy", "-k", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("similarity ") and "Cheapest match" in out
    assert main(["bank", "search", str(bank_path), "monster!", "--family", "minihack",
                 "--json"]) == 0
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert hits[0]["title"] == "Avoid monsters" and {h["family"] for h in hits} == {"minihack"}
    # inspecting does not count as retrieval
    with ExperienceBank.open(bank_path, read_only=True, build_index=False) as bank:
        assert [e.times_retrieved for e in bank.get([1, 2, 3])] == [1, 0, 0]


def test_errors_name_the_fix(tmp_path, capsys):
    assert main(["bank", "stats", str(tmp_path / "nope.sqlite")]) == 2
    assert "no experience bank at" in capsys.readouterr().err
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database" * 100)
    assert main(["bank", "show", str(junk)]) == 2
    assert "not an experience bank" in capsys.readouterr().err
    assert main(["bank"]) == 2  # no action: help
    assert "stats" in capsys.readouterr().out


def test_cli_module_imports_nothing_heavy():
    code = ("import argparse, sys\n"
            "from crl_bench.experience.cli import configure\n"
            "configure(argparse.ArgumentParser())\n"
            "heavy = [m for m in ('torch', 'hnswlib', 'sentence_transformers', 'transformers')"
            " if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def _as_user_without_write_access(cmd: list[str]) -> list[str]:
    """``cmd`` run as a user who cannot write the test folder: as root (who can write
    anywhere), under uid/gid 65534 via setpriv; otherwise as is (the folder is chmod a-w)."""
    import os
    import shutil

    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot drop write access")
    wrapped = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    probe = subprocess.run([*wrapped[:4], sys.executable, "-c", "import crl_bench"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot import crl_bench here: {probe.stderr[-300:]}")
    return wrapped


def test_stats_on_a_read_only_folder(tmp_path):
    """A finished run's folder shared read-only: SQLite cannot create the -shm file a WAL
    database needs, which used to read as "not an experience bank"."""
    import os
    import shutil
    import tempfile

    import numpy as np

    folder = Path(tempfile.mkdtemp(prefix="crl-ro-bank-"))  # in /tmp: reachable by uid 65534
    try:
        folder.chmod(0o755)
        path = folder / "bank.sqlite"
        with ExperienceBank(path, dim=4, embedder_name="e") as bank:
            bank.add([{"title": f"t{i}", "content": "c", "family": "f"} for i in range(2)],
                     np.eye(4, dtype=np.float32)[:2], step=0)
        assert not Path(f"{path}-shm").exists()   # closed cleanly: the file is the whole bank
        path.chmod(0o444)
        folder.chmod(0o555)
        code = ("import sys\nfrom crl_bench.cli import main\n"
                "sys.exit(main(['bank', 'stats', sys.argv[1], '--verify']))")
        res = subprocess.run(_as_user_without_write_access([sys.executable, "-c", code,
                                                            str(path)]),
                             capture_output=True, text=True, cwd=folder,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert res.returncode == 0, res.stderr[-2000:]
        assert "entries       2" in res.stdout and "ok: table and index agree" in res.stdout
        assert "not an experience bank" not in res.stdout + res.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["bank.sqlite", "bank.sqlite.lock"]
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


def test_stats_while_a_writer_holds_the_bank(tmp_path, capsys):
    """The CLI reads without the writer lock: it works beside a running writer and shows what
    that writer has committed."""
    import numpy as np

    path = tmp_path / "bank.sqlite"
    with ExperienceBank(path, dim=4) as writer:
        writer.add([{"title": "t", "content": "c", "family": "f"}], np.ones((1, 4)), step=0)
        assert main(["bank", "stats", str(path)]) == 0
        assert "entries       1" in capsys.readouterr().out
        writer.add([{"title": "u", "content": "c", "family": "g"}], np.ones((1, 4)), step=1)
        assert main(["bank", "show", str(path), "--family", "g"]) == 0
        assert "[g] u" in capsys.readouterr().out
