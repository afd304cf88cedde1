"""What would stop the ``paper`` preset on GPUs at its first step, reproduced on CPU.

* The learners' process group on GPUs: ``init_process_group("nccl")`` maps only the ``cuda``
  device, so the metric sums (a CPU float64 tensor) and the object collectives fail on the
  first update. Reproduced here with the same device map over gloo: every ``nccl`` of the
  backend string :func:`~crl_bench.distributed.learner.join_group` asks for becomes ``gloo``
  on the device it names (plain ``"nccl"`` -> ``"cuda:gloo"``), and the real sharded learner
  runs one update, its metric sums and its weight gather on that group.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _as_gloo(backend: str) -> str:
    """The device map of ``backend`` with NCCL's place taken by gloo (CPU has no NCCL):
    ``"nccl"`` -> ``"cuda:gloo"`` (what torch maps a plain "nccl" to), ``"cpu:gloo,cuda:nccl"``
    -> ``"cpu:gloo,cuda:gloo"``."""
    if backend == "nccl":
        return "cuda:gloo"
    return backend.replace("nccl", "gloo")


@pytest.fixture
def nccl_device_map(monkeypatch):
    """``join_group`` with a GPU spec, its process group built with NCCL's device map over
    gloo; the group is destroyed afterwards."""
    import torch.distributed as dist

    real_init = dist.init_process_group
    seen: list[str] = []

    def init(backend=None, *args, **kwargs):
        seen.append(backend)
        return real_init(_as_gloo(backend), *args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(torch.cuda, "set_device", lambda *_: None)  # no GPU here
    yield seen
    if dist.is_initialized():
        dist.destroy_process_group()


def test_learner_group_on_gpus_carries_cpu_collectives(nccl_device_map):
    """Blocker: the first actor update on NCCL died in ``sum_over_ranks`` (a CPU tensor on a
    group whose device map has no ``cpu``). The group join_group builds for a GPU spec must
    carry the metric sums, the object collectives and a whole sharded update."""
    from _fsdp_worker import CFG, KW, batch

    from crl_bench.distributed.fsdp import ShardedLearner
    from crl_bench.distributed.learner import _free_port, join_group, sum_over_ranks
    from crl_bench.config.schema import OptimConfig

    torch.set_num_threads(1)
    join_group({"device": "cuda"}, 0, 1, ("127.0.0.1", _free_port()))
    assert nccl_device_map and "nccl" in nccl_device_map[0]  # NCCL for the GPU tensors
    import torch.distributed as dist

    # with the plain "nccl" map: "No backend type associated with device type cpu"
    scal = torch.tensor([1.0, 2.0], dtype=torch.float64)
    dist.all_reduce(scal)
    assert scal.tolist() == [1.0, 2.0]
    out = sum_over_ranks(1.5, {"ratio": 2.0, "clip_frac": 0.25})
    assert out == {"ratio": 2.0, "clip_frac": 0.25, "loss": 1.5}
    # the real learner on that group (its model on CPU: the collectives are what is tested)
    learner = ShardedLearner(dict(model_name="tiny-random", seed=0, device="cpu"), "actor",
                             OptimConfig(**CFG), total_steps=4, seed=0)
    before = [w.clone() for w in learner.full_weights()]
    metrics = learner.update(batch(0), **KW)
    assert metrics["skipped"] == 0.0 and torch.isfinite(torch.tensor(metrics["loss"]))
    after = learner.full_weights()
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


# -- the configuration the engines and the plan are built from ---------------------------------
# official yaml: examples/singletask-agentic/single_task_complementaryrl.yaml (ComplementaryRL)
OFFICIAL = {
    # actor_infer.strategy_config.gpu_memory_utilization: 0.85 (:105); sequence_length 32768 (:36)
    "actor": {"max_model_len": 32768, "gpu_memory_utilization": 0.85, "tensor_parallel_size": 1},
    # memory_model.strategy_config: gpu_memory_utilization 0.7 (:255), max_model_len 65536
    # (:258), tensor_parallel_size 4 (:261)
    "extractor": {"max_model_len": 65536, "gpu_memory_utilization": 0.7,
                  "tensor_parallel_size": 4},
}


def test_paper_engine_settings_are_the_official_ones_and_the_plans():
    """Blocker: the engines ran with the backend's defaults (max_model_len 4096, 0.5 of the GPU)
    while paper's conversations reach 32,768 tokens. The settings now come from the config, and
    the memory plan (``crl-bench plan``) counts the same engines: utilization, GPUs per engine,
    engines per role; its layout on 16 GPUs is the paper16 Ray plan."""
    import dataclasses

    from crl_bench.distributed.memory_plan import role_specs, split_gpus
    from crl_bench.distributed.plan import PLANS, layout_plan
    from crl_bench.config.schema import PRESETS
    from crl_bench.run.parts.models import engine_settings

    cfg = PRESETS["paper"]()
    assert cfg.model.placement == "colocated"  # a role's training and inference on its GPUs
    specs = {s.role: s for s in role_specs(cfg, split_gpus(16, "colocated"))}
    for role, want in OFFICIAL.items():
        got = engine_settings(cfg, role)
        assert got == want, role
        assert specs[role].utilization == got["gpu_memory_utilization"]
        assert specs[role].gpus_per_engine == got["tensor_parallel_size"]
        assert got["max_model_len"] >= cfg.rollout.max_episode_tokens  # no prompt refused
    built, paper16 = layout_plan(cfg, 16), PLANS["paper16"]
    for f in ("actor_generation_gpus", "generation_engines", "actor_training_gpus",
              "learner_ranks", "extractor_gpus", "extractor_engines", "extractor_engine_gpus",
              "extractor_ranks"):
        assert getattr(built, f) == getattr(paper16, f), f
    assert paper16.gpus_per_extractor_engine == OFFICIAL["extractor"]["tensor_parallel_size"]
    assert paper16.required()["GPU"] == 16
    assert dataclasses.asdict(paper16)["extractor_ranks"] == specs["extractor"].ranks


def test_engine_shorter_than_an_episode_is_refused():
    from crl_bench.config.schema import PRESETS, ConfigError, apply_overrides
    from crl_bench.run.parts.models import engine_settings

    cfg = apply_overrides(PRESETS["paper"](), {"model.actor_max_model_len": 4096})
    with pytest.raises(ConfigError, match="model.actor_max_model_len=32768"):
        engine_settings(cfg, "actor")


def test_engine_gpus_and_tensor_parallel_must_agree():
    """On GPUs an engine's share of the plan is its tensor-parallel group: paper16's extractor
    engine holds 4 GPUs, so an extractor built with tensor parallel 1 is refused by name."""
    from crl_bench.distributed.context import check_engine_gpus
    from crl_bench.distributed.plan import PLANS
    from crl_bench.config.schema import PRESETS, ConfigError, apply_overrides

    check_engine_gpus(PLANS["paper16"], PRESETS["paper"]())
    cfg = apply_overrides(PRESETS["paper"](), {"model.extractor_tensor_parallel": 1})
    with pytest.raises(ConfigError, match="model.extractor_tensor_parallel=4"):
        check_engine_gpus(PLANS["paper16"], cfg)

def test_paper_checkpointing_is_what_the_plan_assumes():
    """Blocker: ``crl-bench plan`` assumed activation checkpointing (full recompute in the
    official yaml, ``recompute_granularity: full`` :86 and :290) while paper ran without it;
    without it the plan refuses paper on 16 x 80 GB."""
    import inspect

    from crl_bench.distributed.memory_plan import build_plan
    from crl_bench.config.schema import PRESETS

    cfg = PRESETS["paper"]()
    assumed = inspect.signature(build_plan).parameters["checkpointing"].default
    assert cfg.actor.activation_checkpointing is assumed is True
    assert cfg.extractor.activation_checkpointing is assumed
    assert build_plan(cfg, 16, 80).fits
    assert not build_plan(cfg, 16, 80, checkpointing=False).fits


def test_paper_checkpoints_every_100_steps_and_cpu_presets_every_step():
    """A 91 GB checkpoint every step (checkpoint_every=1) was the paper preset's; the official
    yaml saves every 100 (examples/singletask-agentic/single_task_complementaryrl.yaml:29
    ``save_steps: 100``). The run loop still checkpoints at the last step (run/loop.py)."""
    from crl_bench.config.schema import PRESETS

    assert PRESETS["paper"]().checkpoint_every == 100
    for name in ("tiny", "cpu", "quick"):
        assert PRESETS[name]().checkpoint_every == 1, name


def test_plan_prints_the_colocated_topology_it_builds(capsys):
    """``crl-bench plan --gpus 16`` prints the Ray topology built from its layout: the official
    placement (yaml: actor_train and actor_infer on GPUs 0-7, :87 and :111; the memory model's
    engine and trainer on 8-15, :247 and :291), 8 actor engines of 1 GPU (one per GPU, bundles
    0-7) and 8 ranks, 2 extractor engines of 4 GPUs (tensor_parallel_size 4, :261; bundles 0 and
    4) and 8 ranks, engines asleep during the update, weights by CUDA IPC; split, 4 + 4 per role,
    the vllm engines fed by an NCCL broadcast from rank 0. The printed lines are built_topology's of the plan layout_plan gives
    the Ray run (equal to PLANS['paper16'])."""
    import dataclasses

    from crl_bench.cli import main
    from crl_bench.config.schema import PRESETS, apply_overrides
    from crl_bench.distributed.plan import PLANS, built_topology, format_topology, layout_plan

    assert main(["plan", "--gpus", "16", "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    cfg = PRESETS["paper"]()
    built = layout_plan(cfg, 16)
    assert dataclasses.replace(built, name="paper16") == dataclasses.replace(
        PLANS["paper16"], env_workers=built.env_workers, envs_per_worker=built.envs_per_worker,
        cpus_per_env_worker=built.cpus_per_env_worker, cpus_per_engine=built.cpus_per_engine,
        cpus_per_rank=built.cpus_per_rank, cpus_extractor=built.cpus_extractor,
        cpus_experience=built.cpus_experience)
    topo = built_topology(cfg, built)
    for line in format_topology(topo):
        assert line in out, line
    assert topo["placement"] == "colocated" and topo["gpus"] == 16
    assert {k: topo["actor"][k] for k in ("gpus", "engines", "gpus_per_engine", "ranks")} == {
        "gpus": 8, "engines": 8, "gpus_per_engine": 1, "ranks": 8}
    assert topo["actor"]["engine_bundles"] == list(range(8))
    assert {k: topo["extractor"][k] for k in ("gpus", "engines", "gpus_per_engine", "ranks")} == {
        "gpus": 8, "engines": 2, "gpus_per_engine": 4, "ranks": 8}
    assert topo["extractor"]["engine_bundles"] == [0, 4]
    for role in ("actor", "extractor"):
        assert topo[role]["sleep_wake"] and topo[role]["weight_sync"] == "cuda_ipc"
    # each extractor engine's 4 tensor-parallel workers on its 4 bundles (vLLM's Ray executor);
    # the actor's one-GPU engines run their worker in their own process
    assert topo["extractor"]["worker_bundles"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert topo["actor"]["worker_bundles"] is None and topo["actor"]["ray_executor_env"] is None
    assert "NOT BUILT" not in out
    split = built_topology(apply_overrides(cfg, {"model.placement": "split"}),
                           PLANS["paper16-split"])
    assert (split["actor"]["engines"], split["actor"]["ranks"]) == (4, 4)
    assert (split["extractor"]["engines"], split["extractor"]["ranks"]) == (1, 4)
    assert not split["actor"]["sleep_wake"] and split["actor"]["weight_sync"] == "nccl_broadcast"


def test_colocated_tp_engine_fills_its_bundles():
    """Was refused before anything started (``NOT BUILT``): a colocated engine over several
    GPUs, the official extractor's ``tensor_parallel_size`` 4 (yaml :261) on its 8 GPUs beside 8
    FSDP ranks. Built as OpenRLHF builds it: the engine actor takes a share of its first
    bundle's GPU and builds vLLM with ``distributed_executor_backend="ray"``; vLLM's Ray
    executor starts tensor-parallel worker i in bundle ``VLLM_RAY_BUNDLE_INDICES[i]`` of the
    actor's placement group with ``VLLM_RAY_PER_WORKER_GPUS`` of its GPU
    (``openrlhf/trainer/ray/vllm_engine.py:85-87``; vLLM ``ray_executor.py``,
    ``_init_workers_ray``). Every GPU of the role then holds one worker and one rank (rank r is
    in bundle r: a worker's weights come by CUDA IPC from the rank on its GPU), and the shares
    fit each bundle's GPU."""
    from crl_bench.config.schema import PRESETS
    from crl_bench.distributed.plan import PLANS, TP_SHARE, layout_plan

    plan = layout_plan(PRESETS["paper"](), 16)
    assert plan.ray_executor_env("extractor") == PLANS["paper16"].ray_executor_env("extractor") == [
        {"VLLM_RAY_BUNDLE_INDICES": "0,1,2,3", "VLLM_RAY_PER_WORKER_GPUS": "0.25"},
        {"VLLM_RAY_BUNDLE_INDICES": "4,5,6,7", "VLLM_RAY_PER_WORKER_GPUS": "0.25"}]
    assert plan.ray_executor_env("actor") == [None] * 8  # one GPU: vLLM's in-process worker
    assert plan.extractor_engine_options()["num_gpus"] == TP_SHARE == 0.25
    assert plan.engine_options()["num_gpus"] == 0.5
    for role, engine, rank in (("actor", plan.engine_options(), plan.rank_bundle()),
                               ("extractor", plan.extractor_engine_options(),
                                plan.extractor_rank_bundle())):
        bundles = plan.role_bundles(role)
        used = [rank["GPU"]] * len(bundles)  # rank r in bundle r
        for workers, env in zip(plan.worker_bundles(role), plan.ray_executor_env(role)):
            used[workers[0]] += engine["num_gpus"]  # the engine actor on its first bundle
            if env is not None:
                for b in map(int, env["VLLM_RAY_BUNDLE_INDICES"].split(",")):
                    used[b] += float(env["VLLM_RAY_PER_WORKER_GPUS"])
        assert sorted(sum(plan.worker_bundles(role), [])) == list(range(len(bundles))), role
        for b, u in zip(bundles, used):
            assert u <= b["GPU"] + 1e-9, (role, used)
        assert used[plan.engine_bundles(role)[0]] == bundles[0]["GPU"] == 1.0, (role, used)


def test_extractor_engines_serve_the_trained_weights(tmp_path):
    """Silent bug: Search-and-Ask answers came from the extractor's initial weights for the whole
    run (the trained weights reached the driver's HF copy, never the engine that answers). With
    the extractor served like the actor, each update's weights go from its FSDP rank 0 into the
    engines that answer: after an update their weights are the trained ones, and after a resume
    the checkpoint's (pushed into engines that start from the initial weights)."""
    from types import SimpleNamespace

    import ray
    from _fsdp_worker import CFG, KW, batch
    from _ray_local import local_ray

    from crl_bench.distributed.generation import PromptBackend, RemoteGenerationBackend
    from crl_bench.distributed.sharded import ShardedRayLearner, ShardedRoleTrainer
    from crl_bench.llm.types import SamplingParams
    from crl_bench.config.schema import OptimConfig

    class Models:  # the weightless driver's models part, as RayModels has it
        holds_weights = False
        raw_backend = PromptBackend("tiny-random", ("extractor",))
        gen = None

    torch.set_num_threads(1)
    spec = dict(model_name="tiny-random", roles=("extractor",), lora=None, seed=0,
                dtype="float32", device="cpu")
    with local_ray(3):
        gen = RemoteGenerationBackend.start(Models.raw_backend, "hf", spec, 1,
                                            options={"num_cpus": 0.5})
        learner = ShardedRayLearner(2, spec, "extractor", OptimConfig(**CFG), total_steps=4,
                                    seed=1, bundle={"CPU": 0.5})
        try:
            info = SimpleNamespace(run=SimpleNamespace(path=tmp_path))
            trainer = ShardedRoleTrainer(Models(), info, learner, "extractor", gen=gen)
            start = ray.get(gen.engines[0].weights.remote("extractor"))
            prompt = [Models.raw_backend.chat_prompt_ids([{"role": "user", "content": "Hi?"}])]
            sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
            trainer.update(batch(0), **KW)
            trainer.update(batch(1), **KW)
            served = ray.get(gen.engines[0].weights.remote("extractor"))
            trained = learner.weights()
            assert len(served) == len(trained) == len(start)
            assert all(torch.equal(s, t) for s, t in zip(served, trained))
            assert any(not torch.equal(s, w) for s, w in zip(served, start))
            assert gen.version("extractor") == 2  # answers ask for the pushed version
            assert len(gen.generate(prompt, sampling, "extractor")) == 1
            # the same after a resume: a checkpoint at update 2, the run goes on, then resumes
            # with an engine holding its initial weights (as a restarted run's engines do)
            state = trainer.state_dict()
            trainer.update(batch(2), **KW)
            gen.push_weights("extractor", start)
            trainer.load_state_dict(state)
            served = ray.get(gen.engines[0].weights.remote("extractor"))
            assert all(torch.equal(s, t) for s, t in zip(served, trained))
        finally:
            learner.close()
            gen.close()


# -- the paper topology at toy size on Ray (CPU) -----------------------------------------------
# ``paper``'s settings with the 2-layer test model, every role on Ray actors as the memory plan
# lays the paper out on 4 GPUs, colocated as officially (per role 2 GPUs: the actor's 2 engines and
# 2 FSDP ranks in one placement group, the extractor's engine "over 2 GPUs" and 2 FSDP ranks in
# another), without GPUs.
TOY_GPUS = 4
TOY = {
    "model.actor": "tiny-sft", "model.extractor": "tiny-sft", "model.backend": "hf",
    "model.device": "cpu", "model.dtype": "float32", "threads": 1,
    "model.actor_max_model_len": 1024, "model.extractor_max_model_len": 1056,
    "model.extractor_tensor_parallel": 2,
    "rollout.groups": 1, "rollout.group_size": 4, "rollout.max_new_tokens": 16,
    "rollout.max_episode_tokens": 1024, "rollout.sequence_length": 1024,
    "rollout.env_max_steps": {"minihack": 3},
    "actor.lr": 1e-4, "actor.micro_batch_tokens": 2048, "actor.logprob_chunk_tokens": 64,
    "extractor.lr": 1e-4, "extractor.buffer_size": 1, "extractor.max_new_tokens": 32,
    "extractor.micro_batch_tokens": 2048, "extractor.logprob_chunk_tokens": 64,
    "extractor.train_malformed": True,
    "experience.embedder": "all-MiniLM-L6-v2", "experience.bank_fill_steps": 0,
    "experience.gate": False,
    "eval.every": 0, "eval.episodes_per_task": 1,
}


def _toy_run(out, steps, plan):
    from crl_bench.runner.api import run_experiment

    torch.set_num_threads(1)
    return run_experiment("comp_rl", "minihack", "paper", 0, out, steps=steps, overrides=TOY,
                          progress=False, ray={"plan": plan})


@pytest.mark.slow
def test_paper_topology_at_toy_size_on_ray(tmp_path):
    """Blockers: the engines got the backend's defaults instead of the config's settings; the
    driver loaded every model; the extractor was one actor with an unsharded trainer and one
    engine; checkpointing was off. The run below builds the paper's layout at toy size and its
    topology, read back from the running actors, must be the memory plan's: the same engines
    (settings from the config) and FSDP ranks per role (checkpointing on), a driver without
    weights; then 2 steps, a checkpoint and a resume."""
    import json

    from _ray_local import local_ray

    from crl_bench.distributed.memory_plan import role_specs, split_gpus
    from crl_bench.distributed.plan import built_topology, layout_config, layout_plan
    from crl_bench.config.schema import PRESETS, apply_overrides
    from crl_bench.run.parts.models import engine_settings

    pytest.importorskip("ray")
    cfg = apply_overrides(PRESETS["paper"](), dict(TOY))
    assert cfg.actor.activation_checkpointing and cfg.extractor.activation_checkpointing
    assert cfg.model.placement == "colocated"
    specs = {s.role: s for s in role_specs(layout_config(cfg), split_gpus(TOY_GPUS, "colocated"))}
    plan = layout_plan(cfg, TOY_GPUS, name="paper-toy", on_gpus=False, env_workers=1,
                       cpus_per_env_worker=0.25, cpus_per_engine=0.25, cpus_per_rank=0.25)
    printed = built_topology(cfg, plan)  # what `crl-bench plan` prints for this layout
    with local_ray(4):
        run = _toy_run(tmp_path / "run", 1, plan)
        topo = json.loads((run / "ray_topology.json").read_text())
        assert topo["driver_holds_weights"] is False
        assert topo["driver_backends"] == ["PromptBackend"]  # tokenizers, no model
        for role in ("actor", "extractor"):
            spec, want_topo = specs[role], printed[role]
            engines, ranks = topo[f"{role}_engines"], topo[f"{role}_ranks"]
            assert len(engines) == spec.engines == want_topo["engines"], role
            assert len(ranks) == spec.ranks == want_topo["ranks"], role
            want = engine_settings(cfg, role)
            assert want["tensor_parallel_size"] == spec.gpus_per_engine
            assert want["gpu_memory_utilization"] == spec.utilization
            for e in engines:
                assert e["settings"] == dict(want, sleep_mode=True) and e["roles"] == [role], e
            assert {r["rank"] for r in ranks} == set(range(spec.ranks))
            for r in ranks:
                assert r["world_size"] == spec.ranks and r["role"] == role
                assert r["activation_checkpointing"] is True
                assert r["init"] == ("rank 0 loaded" if r["rank"] == 0 else
                                     "meta, filled from rank 0")
            # colocated, as printed: the role's engines and ranks in one placement group
            assert want_topo["sleep_wake"] is True
            groups = {e["placement_group"] for e in engines} | {r["placement_group"] for r in ranks}
            assert len(groups) == 1 and None not in groups, groups
            # an engine over several bundles set vLLM's Ray executor up as printed, and sees
            # the role's group as vLLM will (ray.util.get_current_placement_group())
            executors = want_topo["ray_executor_env"] or [None] * len(engines)
            assert [e["ray_executor"] and e["ray_executor"]["env"] for e in engines] == executors
            assert all(e["ray_executor"]["placement_group"] in groups
                       for e in engines if e["ray_executor"]), engines
            # one process per engine and per rank, none of them the driver
            pids = [e["pid"] for e in engines] + [r["pid"] for r in ranks]
            assert len(set(pids)) == len(pids) and os.getpid() not in pids
        assert topo["actor_engines"][0]["placement_group"] != topo["extractor_engines"][0][
            "placement_group"]
        # the extractor's engine "over 2 GPUs": its workers' bundles 0 and 1 (no GPUs here)
        assert printed["extractor"]["worker_bundles"] == [[0, 1]]
        assert topo["extractor_engines"][0]["ray_executor"]["env"] == {
            "VLLM_RAY_BUNDLE_INDICES": "0,1", "VLLM_RAY_PER_WORKER_GPUS": "0"}
        # the call order each engine served: the engines sleep through every update (nothing
        # generates between a sleep and its wake-up) and a push comes after the wake-up, by the
        # printed path: rollout -> sleep -> update -> wake -> push (no push when the update
        # skipped its batch); the actor's step starts with its rollout
        events = topo["engine_events"]
        for role in ("actor", "extractor"):
            for log in events[role]:
                kinds = [k for k, _ in log]
                assert kinds.count("sleep") >= 1, (role, kinds)
                for i, k in enumerate(kinds):
                    if k == "sleep":
                        assert kinds[i + 1] == "wake_up", (role, kinds)
                    if k == "weights":
                        assert kinds[i - 1] == "wake_up", (role, kinds)
                pushes = [x for k, x in log if k == "weights"]
                assert {x["by"] for x in pushes} <= {printed[role]["weight_sync"]}
                assert [x["version"] for x in pushes] == list(range(1, len(pushes) + 1))
        for log in events["actor"]:
            assert [k for k, _ in log][:3] == ["generate", "sleep", "wake_up"], log
        # the ranks' training states in host memory whenever their engines generate, back only
        # while the engines sleep (the official offload_states before each rollout)
        from test_weight_sync import check_offload_order

        for role in ("actor", "extractor"):
            for rank_log in topo["learner_events"][role]:
                assert ("reload", "update") in [(k, x["why"]) for k, x in rank_log], rank_log
                for log in events[role]:
                    check_offload_order(log, rank_log)
        assert printed["actor"]["weight_sync"] == "object_store"  # CPU: the fallback
        # the step-1 checkpoint: each role's FSDP ranks wrote their shards; the driver none
        folders = sorted(p.name for p in (run / "learner_checkpoints").iterdir())
        assert [f.split("_update_")[0] for f in folders] == ["actor", "extractor"], folders
        held = [f for f in (run / "checkpoints").rglob("*")
                if f.suffix in (".safetensors", ".bin") or f.stat().st_size > 2**20]
        assert not held, held  # no copy of any model in the run's own checkpoint
        run = _toy_run(tmp_path / "run", 2, plan)  # resumed from the step-1 checkpoint
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    assert [m["step"] for m in metrics if "step" in m][-2:] == [1, 2]
