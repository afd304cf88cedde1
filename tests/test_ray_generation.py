"""The generation engine actor: the same tokens as the driver's own backend for the same weights
and seed, weights pushed as one object ref, and an engine killed by pid (mid-call, or between
calls so that Ray silently restarts it with its initial weights) never returns tokens from the
wrong weights: the call is redone on an engine given the current weights."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SPEC = dict(model_name="tiny-random", roles=("actor",), lora=None, seed=0, dtype="float32",
            device="cpu")


@pytest.fixture(scope="module")
def cluster():
    with local_ray(2):
        yield


def test_engine_matches_local_and_survives_kills(cluster):
    from crl_bench.distributed.generation import RemoteGenerationBackend
    from crl_bench.training.precision import load_role_weights, role_weights
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import SamplingParams

    torch.set_num_threads(1)
    local = HFBackend(**SPEC)
    # weights the engine did not start with: a restarted engine would sample differently
    w = role_weights(local, "actor")
    g = torch.Generator().manual_seed(3)
    load_role_weights(local, "actor", [t + 0.05 * torch.randn(t.shape, generator=g) for t in w])
    prompts = [local.chat_prompt_ids([{"role": "user", "content": f"Question number {i}?"}])
               for i in range(48)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64, seed=7)
    want = [(x.completion_ids, x.text) for x in local.generate(prompts, sampling, "actor")]

    gen = RemoteGenerationBackend.start(local, "hf", SPEC, 1, options={"num_cpus": 1})
    try:
        gen.push_weights("actor", role_weights(local, "actor"))
        t0 = time.perf_counter()
        got = gen.generate(prompts, sampling, "actor")
        call_s = time.perf_counter() - t0
        assert [(x.completion_ids, x.text) for x in got] == want
        assert gen.tokenizer is local.tokenizer  # prompts are built on the driver

        # killed mid-call
        pid = ray.get(gen.engines[0].pid.remote())
        killer = threading.Timer(call_s / 2, os.kill, (pid, signal.SIGKILL))  # mid-call
        killer.start()
        got = gen.generate(prompts, sampling, "actor")
        killer.join()
        assert gen.engine_failures == 1
        assert [(x.completion_ids, x.text) for x in got] == want

        # killed between calls: Ray restarts it with its initial weights; it must refuse
        pid = ray.get(gen.engines[0].pid.remote())
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        got = gen.generate(prompts, sampling, "actor")
        assert gen.engine_failures == 2
        assert [(x.completion_ids, x.text) for x in got] == want
    finally:
        gen.close()
