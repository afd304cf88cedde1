"""Weights from the learner into the generation engines by broadcast, the engines' sleep /
wake-up around the update and the learner's states in host memory during the rollout (the
colocated topology's order), on CPU.

The broadcast path is the one a run takes on GPUs between GPUs of their own (``nccl_broadcast``):
learner rank 0 and the engines join a process group created for the push (a ``TCPStore`` and a
``ProcessGroupNCCL``; here ``ProcessGroupGloo``, the same construction and the same broadcast
calls, :mod:`crl_bench.distributed.weight_sync`) and rank 0 broadcasts each gathered tensor into
the engines' models in place. Here the learner is the real FSDP2 ``ShardedLearner`` (one gloo
rank) after a real update, the engine a Ray actor holding the real tiny model.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_weight_path_follows_device_engines_and_placement():
    from crl_bench.distributed.weight_sync import sync_method

    # GPUs of their own: one NCCL broadcast from rank 0 (OpenRLHF / verl), into an hf engine's
    # actor or a vllm engine's workers; colocated: an engine and a rank on one GPU, where NCCL
    # refuses two members of a group: CUDA IPC (vLLM's ipc)
    assert sync_method("auto", "cuda", "vllm", colocated=True) == "cuda_ipc"
    assert sync_method("auto", "cuda", "hf", colocated=False) == "nccl_broadcast"
    assert sync_method("auto", "cuda", "vllm", colocated=False) == "nccl_broadcast"
    # without CUDA: the object store, or the broadcast over gloo when asked for
    assert sync_method("auto", "cpu", "hf", colocated=True) == "object_store"
    assert sync_method("broadcast", "cpu", "hf", colocated=False) == "gloo_broadcast"
    assert sync_method("broadcast", "cpu", "vllm", colocated=False) == "gloo_broadcast"
    assert sync_method("object_store", "cuda", "vllm", colocated=False) == "object_store"
    with pytest.raises(ValueError, match="auto, object_store or broadcast"):
        sync_method("ipc", "cuda", "vllm", colocated=True)


def test_vllm_engines_are_built_for_the_path_the_plan_prints():
    """A vllm engine receives from the learner ranks only through the weight-transfer engine it
    was built with: split on GPUs vLLM's ``nccl`` (was: built for ``ipc``, so the push took the
    object store), colocated ``ipc``, on CPUs the project's ``gloo``; none for the object store
    (the engine's HF copy sends) or hf engines. The path is the one ``crl-bench plan`` prints
    (``built_topology``), ``model.device=auto`` on a plan with GPUs included."""
    import dataclasses

    from crl_bench.config.schema import PRESETS, apply_overrides
    from crl_bench.distributed.plan import PLANS, ResourcePlan, built_topology
    from crl_bench.distributed.weight_sync import engine_transfer, role_sync_method, synced

    def paper(**sets):  # apply_overrides changes the config it is given: a fresh one each
        return apply_overrides(PRESETS["paper"](), {f"model.{k}": v for k, v in sets.items()})

    gpus, split = PLANS["paper16-split"], "split"
    cases = [  # (config, plan, path, engine setting)
        (paper(placement=split), gpus, "nccl_broadcast", {"weight_transfer": "nccl"}),
        (paper(placement=split, device="auto"), gpus, "nccl_broadcast",
         {"weight_transfer": "nccl"}),
        (paper(), PLANS["paper16"], "cuda_ipc", {"weight_transfer": "ipc"}),
        (paper(placement=split), dataclasses.replace(gpus, weight_sync="object_store"),
         "object_store", {}),
        (paper(placement=split, backend="hf"), gpus, "nccl_broadcast", {}),
        (paper(placement=split, device="cpu"), ResourcePlan(name="cpu", weight_sync="broadcast"),
         "gloo_broadcast", {"weight_transfer": "gloo"}),
        (paper(placement=split, device="cpu"), ResourcePlan(name="cpu"), "object_store", {}),
    ]
    for cfg, plan, path, setting in cases:
        assert role_sync_method(plan, cfg) == path, (plan.name, path)
        assert built_topology(cfg, plan)["actor"]["weight_sync"] == path, (plan.name, path)
        assert engine_transfer(plan, cfg) == setting, (plan.name, path)
        if not plan.colocated:  # and the path the role's learner pushes by
            assert synced(None, None, plan, cfg, "actor").method == path, (plan.name, path)


def check_offload_order(engine_log: list, rank_log: list) -> None:
    """A colocated learner rank's ``offload`` / ``reload`` log against its engine's calls, in
    time order (both stamp ``time.monotonic``, one clock per machine): the states are in host
    memory whenever the engine generates, come back only while it sleeps whole (the official
    pipeline offloads the training states before each rollout: roll/pipeline/agentic/
    agentic_pipeline.py:193 of pUmpKin-Co/ComplementaryRL), and leave before its KV cache
    wakes; a push lands in awake weights."""
    events = sorted([(x["t"], k, x) for k, x in engine_log] + [(x["t"], k, x) for k, x in rank_log],
                    key=lambda e: e[0])
    assert events and events[0][1] == "offload", events[:2]  # offloaded before any rollout
    loaded, sleeping = True, set()
    for _, kind, x in events:
        if kind == "generate":
            assert not loaded and not sleeping, "generation beside the learner's states"
        elif kind == "reload":
            assert sleeping == {"weights", "kv_cache"}, "states back beside an awake engine"
            loaded = True
        elif kind == "offload":
            assert loaded
            loaded = False
        elif kind == "sleep":
            sleeping = {"weights", "kv_cache"}
        elif kind == "wake_up":
            assert not (loaded and "kv_cache" in x["tags"]), "the KV cache woke beside the states"
            sleeping -= set(x["tags"])
        elif kind == "weights":
            assert "weights" not in sleeping
    assert not loaded and not sleeping


def test_learner_broadcasts_its_weights_into_an_engine_over_gloo(tmp_path):
    """The run's code path (the role trainer over a colocated :class:`SyncedLearner` with its
    states offloaded, 2 FSDP rank actors, one engine actor): rollout -> sleep -> reload ->
    update -> wake the weights -> push -> offload -> wake the KV cache, read back from the
    engine and the ranks (:func:`check_offload_order`); after each push the engine's weights
    equal the learner's (gathered from its shards by rank 0's broadcast), differ from its
    initial ones, and it generates with them under the pushed version."""
    from types import SimpleNamespace

    import ray
    from _fsdp_worker import CFG, KW, batch
    from _ray_local import local_ray

    from crl_bench.config.schema import OptimConfig
    from crl_bench.distributed.generation import PromptBackend, RemoteGenerationBackend
    from crl_bench.distributed.sharded import ShardedRayLearner, ShardedRoleTrainer
    from crl_bench.distributed.weight_sync import SyncedLearner
    from crl_bench.llm.types import SamplingParams

    torch.set_num_threads(1)
    spec = dict(model_name="tiny-random", roles=("actor",), lora=None, seed=0, dtype="float32",
                device="cpu")

    class Models:  # the weightless driver's models part, as RayModels has it
        holds_weights = False
        raw_backend = PromptBackend("tiny-random", ("actor",))

    prompt = [Models.raw_backend.chat_prompt_ids([{"role": "user", "content": "Hi?"}])]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
    with local_ray(3):
        gen = RemoteGenerationBackend.start(Models.raw_backend, "hf", spec, 1,
                                            options={"num_cpus": 0.5})
        learner = ShardedRayLearner(2, spec, "actor", OptimConfig(**CFG), total_steps=4, seed=0,
                                    bundle={"CPU": 0.5})
        try:
            engine = gen.engines[0]
            start = ray.get(engine.weights.remote("actor"))
            # meta-device initialisation: rank 1 read no weights, its shards came from rank 0's
            # loaded model; gathered, the learner's weights are the loaded model's
            inits = ray.get([r.__ray_call__.remote(lambda rank: rank.learner.init)
                             for r in learner.ranks])
            assert inits == ["rank 0 loaded", "meta, filled from rank 0"]
            assert all(torch.equal(a, b) for a, b in zip(learner.weights(), start))
            synced = SyncedLearner(learner, gen, method="gloo_broadcast", colocated=True,
                                   kind="hf", offload=True)
            info = SimpleNamespace(run=SimpleNamespace(path=tmp_path))
            trainer = ShardedRoleTrainer(Models(), info, synced, "actor", gen=gen)
            for step in (1, 2):
                gen.generate(prompt, sampling, "actor")  # the rollout
                assert trainer.update(batch(step), **KW)["skipped"] == 0.0
                served = ray.get(engine.weights.remote("actor"))
                trained = synced.weights()  # from host memory: back on the ranks, asleep
                assert len(served) == len(trained) == len(start)
                assert all(torch.equal(s, t) for s, t in zip(served, trained)), step
            assert any(not torch.equal(s, w) for s, w in zip(served, start))
            assert gen.version("actor") == 2
            assert len(gen.generate(prompt, sampling, "actor")) == 1  # asks for version 2
            log = gen.events()[0]
            # the ranks' states were in host memory during each rollout: back after the sleep,
            # out again after the push, before the KV cache wakes; reading the weights puts the
            # engine to sleep for the gather
            assert [k for k, _ in log] == ["generate", "sleep", "wake_up", "weights", "wake_up",
                                           "sleep", "wake_up"] * 2 + ["generate"]
            assert [x["tags"] for k, x in log if k == "wake_up"] == [
                ["weights"], ["kv_cache"], ["kv_cache", "weights"]] * 2
            ranks_log = learner.state_events()
            for rank_log in ranks_log:
                assert [(k, x["why"]) for k, x in rank_log] == [("offload", "rollout")] + [
                    ("reload", "update"), ("offload", "rollout"),
                    ("reload", "weights"), ("offload", "weights")] * 2
                check_offload_order(log, rank_log)
            assert [x["version"] for k, x in log if k == "weights"] == [1, 2]
            assert {x["by"] for k, x in log if k == "weights"} == {"gloo_broadcast"}  # the name the plan prints
            # on CPU the engine has no vLLM sleep mode: each sleep was the recorded reset only
            assert {(x["level"], x["vllm"]) for k, x in log if k == "sleep"} == {(1, False)}
            with pytest.raises(RuntimeError, match="sleep\\(\\) on a sleeping engine"):
                gen.sleep()
                gen.sleep()
        finally:
            learner.close()
            gen.close()
