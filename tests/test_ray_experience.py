"""The experience service (ExperienceManager in a Ray actor): writes from several callers at once
land once each (one writer), retrieval through the service finds them, and a service killed by
pid comes back (max_restarts) with every committed entry."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
pytest.importorskip("sentence_transformers")

from crl_bench.distributed.experience import RemoteManager  # noqa: E402

RETRIEVAL = dict(k=1, oversample=4, diversify=False, seed=0)


@pytest.fixture(scope="module")
def cluster():
    with local_ray(3):
        yield


@ray.remote(num_cpus=0)
def writer(actor, name: str, n: int) -> list[int]:
    from crl_bench.distributed.experience import RemoteManager
    from crl_bench.experience.manager import Operation

    mgr = RemoteManager(actor)
    ids: list[int] = []
    for i in range(n):
        ids += mgr.apply_operations(
            [Operation("add", title=f"{name} tip {i}", content=f"When {name} {i}, do {name}-{i}.")],
            family="minihack", task_id=f"{name}-{i}", provenance={"run": name}, step=i)
    return ids


def test_service_one_writer_retrieval_and_restart(cluster, tmp_path):
    mgr = RemoteManager.start(str(tmp_path / "bank.sqlite"), "all-MiniLM-L6-v2", 100, RETRIEVAL,
                              max_restarts=1)
    try:
        a, b = ray.get([writer.remote(mgr.actor, "alpha", 4), writer.remote(mgr.actor, "beta", 4)])
        ids = a + b
        assert len(ids) == len(set(ids)) == 8  # every write once, no id twice
        assert mgr.stats()["bank/size"] == 8
        hits = mgr.retrieve(["When beta 2, do beta-2."], family="minihack")
        assert len(hits) == 1 and hits[0][0].title == "beta tip 2"
        got = mgr.get(ids)
        assert sorted(e.id for e in got) == sorted(ids)
        pid = ray.get(mgr.actor.pid.remote())
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 300  # a loaded machine restarts slowly
        while True:  # Ray restarts the service; it reopens the same bank file
            try:
                assert ray.get(mgr.actor.pid.remote(), timeout=5) != pid
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError,
                    ray.exceptions.ActorUnavailableError):
                assert time.time() < deadline
                time.sleep(0.5)
        assert mgr.stats()["bank/size"] == 8
        assert mgr.retrieve(["When alpha 1, do alpha-1."], family="minihack")[0][0].title == "alpha tip 1"
    finally:
        mgr.close()
