"""The pre-rollout flush's checks answer alike on one process and on Ray.

With ``extractor.fence=official`` the flush (``ExperiencePart.wait_for_bank``) skips while an
extractor update is uncollected and counts the skip, and merges every ``merge_every`` steps when
the track merges at all (official: the merge sits inside the flush, ``multi_agentic_pipeline.py``
:1237-1261, skipped while an update is pending, :1603-1604). On Ray the track is
:class:`~crl_bench.distributed.extractor.RemoteExtractorTrack`, whose forwarding turns an
attribute read into a bound method (always true) and whose ``stats`` is a copy: a check that read
``track.merge_every`` merged with merging off, and a skip counted into ``stats[...]`` was lost.

Real parts: a local Ray cluster, the extractor actor holding the tiny model, the experience
service; the driver side is the real run context (tiny preset).
"""

from __future__ import annotations

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
pytest.importorskip("nle")
pytest.importorskip("sentence_transformers")


def test_flush_checks_through_the_ray_track(tmp_path):
    from crl_bench.baselines.comp_rl import AGENT as COMP_RL
    from crl_bench.distributed.context import _spec_of
    from crl_bench.distributed.experience import RemoteManager
    from crl_bench.distributed.extractor import RemoteExtractorTrack
    from tests.test_fidelity_launched import make_ctx

    ctx = make_ctx(tmp_path, **{"extractor.wait_before_rollout": True,
                                "extractor.fence": "official", "experience.merge_every": 1,
                                "extractor.merge_format": "items"})
    part = ctx.experience
    cfg = ctx.info.cfg
    local = part.extractor  # the context's own track, closed with it
    try:
        with local_ray(2):
            service = RemoteManager.start(str(tmp_path / "service.sqlite"),
                                          cfg.experience.embedder, 100,
                                          {"k": 1, "diversify": False})
            made = []

            def remote_track(settings, *, train):
                track = RemoteExtractorTrack.start(
                    service.actor, cfg.model.backend, _spec_of(ctx.info, ctx.models.ext_raw),
                    cfg.extractor, ctx.models.extractor_sampling, settings, train=False,
                    total_steps=cfg.steps, seed=cfg.seed + 1)
                made.append(track)
                return track
            part.new_track = remote_track
            part.build_extractor(COMP_RL.extractor_step, train=False, merge=False)
            track = part.extractor
            try:
                assert track.merge_period() == 0
                # merging off: a merge step's flush does not merge
                ctx.step = 2
                ctx.wait_for_bank()
                assert track.stats["merges"] == 0
                # an uncollected update: the flush is skipped and the skip is counted remotely
                ray.get(track.actor.call.remote("__setattr__", ("_uncollected", True), {}))
                ctx.step = 3
                ctx.wait_for_bank()
                assert track.stats["flush_skipped"] == 1 and not track.update_pending()
                # merging on: the next merge step's flush merges once (its evaluation: never)
                ray.get(track.actor.call.remote("__setattr__", ("merge_every", 1), {}))
                ctx.step = 4
                ctx.wait_for_bank()
                part.wait_for_bank(merge=False)
                assert track.stats["merges"] == 1 and track.stats["flush_skipped"] == 1
                # a data attribute read through the forwarding is refused with the fix named
                with pytest.raises(TypeError, match="merge_period"):
                    track.merge_every()
            finally:
                for t in made:
                    t.close()
                part.extractor = local
                service.close()
    finally:
        ctx.close()
