"""Every script in experiments/ answers ``--help`` with its usage, from any working directory
(argparse runs before the heavy imports, so this takes about a second for all of them), and
experiments/README.md lists every script.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SCRIPTS = sorted(p.name for p in EXPERIMENTS.glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage(script, tmp_path):
    res = subprocess.run([sys.executable, str(EXPERIMENTS / script), "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("usage:"), res.stdout[:300]


def test_the_readme_lists_every_script():
    readme = (EXPERIMENTS / "README.md").read_text()
    assert SCRIPTS and [s for s in SCRIPTS if f"`{s}`" not in readme] == []
