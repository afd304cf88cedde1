"""The Ray extractor host (``extractor.runs=process`` on Ray,
:class:`~crl_bench.distributed.extractor.RayHost`) resumes exactly, as the process host does:
its state carries its process's RNG (:class:`~crl_bench.training.host.ProcessHostServer`, shared
by both hosts), so a generation without a sampling seed after a resume draws what the
uninterrupted host draws. Real parts: a local Ray cluster, two host actors on the tiny model."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")


def test_a_resumed_ray_host_samples_what_the_uninterrupted_one_does():
    from _ray_local import local_ray

    from crl_bench.distributed.extractor import RayHost
    from crl_bench.llm.types import SamplingParams

    spec = dict(model_name="tiny-random", roles=("extractor",), lora=None, dtype="float32",
                device="cpu", seed=0)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)  # no seed: the process's RNG
    messages = [[{"role": "user", "content": "Goal: reach the stairs. What did you learn?"}]]

    def start() -> RayHost:
        return RayHost.start("hf", spec, "extractor", sampling, rng_seed=5,
                             options={"num_cpus": 0.5})

    def sample(host: RayHost) -> list[list[int]]:
        return [g.completion_ids for g in host.generate(messages)]

    with local_ray(2):
        a, b = start(), start()
        try:
            first = sample(a)
            state = a.snapshot()["state"]  # what a checkpoint keeps
            want = sample(a)
            assert want != first  # the RNG moved on: a host that lost it samples `first`
            b.load_state_dict(state)
            assert sample(b) == want
        finally:
            a.close()
            b.close()
