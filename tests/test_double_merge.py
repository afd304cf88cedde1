"""A merge pass runs at most once per merge step, with evaluation on (the real loop).

Officially the flush before each rollout, and the every-``merging_interval`` merge inside it, is
decided once per step (``multi_agentic_pipeline.py:1237-1261``, the merge at :1255-1261); the
step's evaluation (:1303) plays after it and does not flush or merge again. Our loop evaluates
after the step's training rollout: the evaluation's plays must not run the merge a second time.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")


@pytest.mark.slow
def test_one_merge_pass_per_merge_step_with_evaluation_every_step(tmp_path, monkeypatch):
    from crl_bench.extractor import merge as merge_mod
    from crl_bench.runner.api import run_experiment

    calls: list[int] = []
    orig = merge_mod.merge_bank

    def counted(manager, *args, **kwargs):
        calls.append(kwargs.get("step"))
        return orig(manager, *args, **kwargs)
    monkeypatch.setattr(merge_mod, "merge_bank", counted)
    # the official fencing (merges inside the pre-rollout flush) with evaluation at every step,
    # both evaluation modes (two evaluation plays per step), as under `paper`
    run_experiment("comp_rl", "minihack", "tiny", 0, tmp_path / "run", steps=2, progress=False,
                   overrides={"threads": 1, "extractor.runs": "inline",
                              "extractor.wait_before_rollout": True, "extractor.fence": "official",
                              "experience.merge_every": 2, "eval.every": 1,
                              "eval.episodes_per_task": 1, "eval.at_start": False})
    assert calls == [2]  # one pass at the merge step (old: [2, 2, 2]), none at step 1
