"""The sharded learner on Ray (FSDP2 ranks as Ray actors, gloo) for full fine-tuning, on the tiny
model, against ``RoleTrainer.update`` on one process:

- 2 sharded ranks give the single process's parameters after 3 updates (fp32 tolerance, the
  bounds of tests/test_fsdp.py), and their metrics;
- after each update rank 0 pushes the weights into the generation engine under a new version:
  the engine's sampled tokens and their log-probs equal the single-process model's (seeded), a generation that names the
  previous version is refused (StaleWeights), and the driver process neither fetches nor puts
  a weight tensor (every ``ray.get`` / ``ray.put`` of the driver is inspected) while its own copy
  of the model stays as it was until it pulls the weights on purpose;
- a sharded checkpoint saved at update 2 and loaded by 2 fresh ranks continues to the same
  weights as the uninterrupted run (bit for bit).
"""

from __future__ import annotations

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _fsdp_worker import CFG, KW, batch  # noqa: E402

SPEC = dict(model_name="tiny-random", roles=("actor",), lora=None, seed=0, dtype="float32",
            device="cpu")


def tensors_in(obj) -> int:
    """Elements of every torch tensor inside ``obj`` (lists, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, (list, tuple)):
        return sum(tensors_in(x) for x in obj)
    if isinstance(obj, dict):
        return sum(tensors_in(x) for x in obj.values())
    return 0


@pytest.fixture(scope="module")
def cluster():
    with local_ray(4):
        yield


def test_sharded_ray_learner_trains_pushes_and_resumes(cluster, tmp_path, monkeypatch):
    from crl_bench.distributed.generation import RemoteGenerationBackend
    from crl_bench.training.precision import role_weights
    from crl_bench.distributed.sharded import ShardedRayLearner
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import SamplingParams, StaleWeights
    from crl_bench.config.schema import OptimConfig
    from crl_bench.training.role_trainer import RoleTrainer

    torch.set_num_threads(1)
    cfg = OptimConfig(**CFG)
    ref_backend = HFBackend(**dict(SPEC, share_prompt_prefix=False))
    ref = RoleTrainer(ref_backend, "actor", cfg, total_steps=10, seed=0)
    start = [p.detach().clone() for p in ref.params]
    driver = HFBackend(**SPEC)  # the driver's copy: must not follow the updates by itself
    prompts = [driver.chat_prompt_ids([{"role": "user", "content": f"Question {i}?"}])
               for i in range(3)]
    # seeded sampling: the tokens and their log-probs follow the weights closely (the random
    # model's greedy tokens are one repeated token, whatever the small updates do)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    before = driver.generate(prompts, sampling, "actor")

    gen = RemoteGenerationBackend.start(driver, "hf", SPEC, 1, options={"num_cpus": 1})
    learner = ShardedRayLearner(2, SPEC, "actor", cfg, total_steps=10, seed=0)
    ckpt = tmp_path / "update2"
    fetched, put = [], []
    real_get, real_put = ray.get, ray.put
    try:
        assert len(set(learner.pids)) == 2
        gen.push_weights("actor", role_weights(driver, "actor"))  # the start weights: version 1
        monkeypatch.setattr(ray, "get", lambda *a, **k: fetched.append(real_get(*a, **k))
                            or fetched[-1])
        monkeypatch.setattr(ray, "put", lambda obj, **k: put.append(obj) or real_put(obj, **k))
        for i in range(3):
            m_ref = ref.update(batch(i), **KW)
            m = learner.update(batch(i), **KW)
            for k in ("loss", "grad_norm", "clip_frac", "tokens", "samples", "active_samples"):
                assert m[k] == pytest.approx(m_ref[k], rel=1e-5, abs=1e-7), (i, k)
            version = gen.version("actor") + 1
            gen.weights_loaded("actor", learner.push_weights(gen.engines, "actor", version),
                               version)
            assert gen.version("actor") == i + 2
            got = gen.generate(prompts, sampling, "actor")
            want = ref_backend.generate(prompts, sampling, "actor")
            assert [g.completion_ids for g in got] == [w.completion_ids for w in want], i
            for g, w in zip(got, want):
                torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs),
                                           rtol=0, atol=1e-4)
            with pytest.raises(StaleWeights):  # a caller that expects the previous version
                real_get(gen.engines[0].generate.remote(prompts, sampling, "actor", None,
                                                        {"actor": version - 1}))
            if i == 1:
                learner.save(str(ckpt))
        # the updates changed what the engine samples (or at least its log-probs)
        assert [g.completion_ids for g in got] != [b.completion_ids for b in before] or max(
            abs(x - y) for g, b in zip(got, before) for x, y in zip(g.logprobs, b.logprobs)) > 1e-2
        # the driver fetched and put samples, metrics and object refs: no weight tensor
        n_params = sum(t.numel() for t in start)
        assert fetched and put
        assert max(tensors_in(x) for x in fetched + put) < n_params // 100
        monkeypatch.undo()
        for a, b in zip(role_weights(driver, "actor"), start):
            assert torch.equal(a, b)  # the driver's copy did not follow
        whole = learner.weights()  # the explicit pull (checkpoints)
    finally:
        monkeypatch.undo()
        learner.close()
    moved = 0.0
    for w, p, s in zip(whole, ref.params, start):
        torch.testing.assert_close(w, p.detach(), rtol=1e-5, atol=1e-6)
        moved = max(moved, float((p.detach() - s).abs().max()))
    assert moved > 1e-3  # three real steps (lr 1e-3)

    resumed = ShardedRayLearner(2, SPEC, "actor", cfg, total_steps=10, seed=0)
    try:
        resumed.load(str(ckpt))
        assert resumed.updates == 2
        resumed.update(batch(2), **KW)
        again = resumed.weights()
    finally:
        resumed.close()
        gen.close()
    for a, b in zip(again, whole):
        assert torch.equal(a, b)


def test_lora_and_mini_batches_are_refused_before_ray_starts_anything():
    """LoRA keeps the replicated learner; several optimiser steps per update are refused by
    name — no cluster needed to see it."""
    from crl_bench.distributed.sharded import ShardedRayLearner
    from crl_bench.llm.types import LoraSpec
    from crl_bench.config.schema import ConfigError, OptimConfig

    with pytest.raises(ConfigError, match="full fine-tuning"):
        ShardedRayLearner(2, dict(SPEC, lora=LoraSpec()), "actor", OptimConfig(), total_steps=1)
    with pytest.raises(ConfigError, match=r"actor\.mini_batches=1"):
        ShardedRayLearner(2, SPEC, "actor", OptimConfig(mini_batches=2), total_steps=1)
