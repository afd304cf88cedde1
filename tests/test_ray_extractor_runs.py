"""``extractor.runs`` means on Ray what it means on one machine: ``process`` puts the
extractor's model and trainer in a process of their own (on Ray a Ray actor, the
:class:`~crl_bench.distributed.extractor.RayHost`), ``thread`` keeps them in the driver's
process behind the model lock; the track stays on the driver either way. (Before, a Ray run put
the whole track in an actor whatever ``extractor.runs`` said.)

Real parts: a local Ray cluster, the tiny preset's model in the driver, its engine, learner
ranks and (``process``) the extractor's actor, the experience service; where the extractor runs
is read back from the running host (``ray_topology.json``'s ``extractor`` entry), and one
extraction call is answered there.
"""

from __future__ import annotations

import os

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
pytest.importorskip("nle")
pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def cluster():
    with local_ray(4):
        yield


@pytest.mark.parametrize("runs", ["process", "thread"])
def test_extractor_runs_where_the_setting_says_on_ray(cluster, tmp_path, runs):
    import crl_bench  # noqa: F401  (registers the crl/ envs)
    from crl_bench.agent import load_agent
    from crl_bench.config.schema import build_config
    from crl_bench.distributed.context import RayCluster, RayRunContext
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny",
                       overrides={"threads": 1, "extractor.runs": runs})
    ctx = RayRunContext(cfg, RunDir(tmp_path / runs), RayCluster(1, plan="cpu"))
    try:
        ctx.seed_everything()
        load_agent("comp_rl").build(ctx)
        where = ctx.topology()["extractor"]
        assert where["runs"] == runs == ctx.extractor_runs
        if runs == "process":
            assert where["host"] == "RayHost" and where["pid"] != os.getpid()
            assert where["trains"] is True
        else:
            assert where["host"] == "LocalHost" and where["pid"] == os.getpid()
        # the track is the driver's, and its model calls reach the host
        assert type(ctx.extractor).__name__ == "ExtractorTrack"
        out = ctx.experience.generate([[{"role": "user", "content": "Say one word."}]])
        assert len(out) == 1 and out[0].completion_ids
    finally:
        ctx.close()
