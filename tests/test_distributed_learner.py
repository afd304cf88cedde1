"""The learner as 2 data-parallel ranks (Ray actors, torch.distributed gloo) against
``RoleTrainer.update`` on one process, on the tiny model and the same batch: the reduced
gradient, the loss and diagnostics, and the parameters after the step agree within fp32
tolerance. The gradient is compared too because AdamW's first step is nearly invariant to the
gradient's scale (a wrong share would not show in the parameters alone)."""

from __future__ import annotations

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_bench.llm.hf_backend import HFBackend  # noqa: E402
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.config.schema import OptimConfig  # noqa: E402
from crl_bench.training.role_trainer import RoleTrainer, TrainSample  # noqa: E402

SPEC = dict(model_name="tiny-random", roles=("actor",), lora=None, seed=0, dtype="float32",
            device="cpu")
QUESTIONS = ["Which way is north?", "Name a fruit.", "Count to three, please, slowly.",
             "What is 2+2?", "Say hi.", "Describe a room with a door and a staircase.",
             "Go east.", "Open the door."]


@pytest.fixture(scope="module")
def cluster():
    with local_ray(3):
        yield


@pytest.fixture(scope="module")
def batch():
    torch.set_num_threads(1)
    backend = HFBackend(**SPEC)
    prompts = [backend.chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    gens = backend.generate(prompts, SamplingParams(temperature=0.8, max_new_tokens=10, seed=5),
                            max_new_tokens=[10, 4, 7, 9, 5, 3, 8, 6])
    advs = [1.0, -0.5, 0.0, 0.75, -1.0, 0.5, 0.25, -0.25]  # one zero: counts in the denominator
    weights = [1.0, 1.0, 1.0, 0.5, 1.0, 0.0, 1.0, 1.0]     # one zero weight too
    samples = [TrainSample(list(g.prompt_ids), list(g.completion_ids),
                           [lp - 0.05 * (i % 3) for lp in g.logprobs], a, w)
               for i, (g, a, w) in enumerate(zip(gens, advs, weights))]
    return backend, samples


def masked(samples):
    """The batch with one trajectory-level sample (a completion mask with a 0-span in the middle:
    two assistant turns around an observation), as ``actor.sample_unit: trajectory`` makes."""
    s = samples[0]
    n = len(s.completion_ids)
    mask = [1] * 3 + [0] * 2 + [1] * (n - 5)
    keep = [lp for lp, m in zip(s.old_logprobs, mask) if m]
    return [TrainSample(s.prompt_ids, s.completion_ids, keep, s.advantage, s.weight, mask)] + samples[1:]


@pytest.mark.parametrize("agg,recompute", [("token-mean", False), ("seq-mean-token-mean", False),
                                           ("token-mean", True)])
def test_two_ranks_equal_one_process(cluster, batch, agg, recompute):
    from crl_bench.distributed.learner import DataParallelLearner
    from crl_bench.training.precision import load_role_weights, role_weights

    backend, samples = batch
    if recompute:  # old log-probs recomputed by the trainer, and a masked trajectory sample
        samples = masked(samples)
        assert samples[0].n_tokens < len(samples[0].completion_ids)
    cfg = OptimConfig(lr=1e-3, micro_batch_size=2, max_grad_norm=1e9,
                      recompute_old_logprobs=recompute)
    start = role_weights(backend, "actor")
    ref = RoleTrainer(backend, "actor", cfg, total_steps=4, seed=0)
    captured = []
    step = ref.optimizer.step

    def capture_step(*a, **k):
        captured.append([p.grad.detach().clone() for p in ref.params])
        return step(*a, **k)

    ref.optimizer.step = capture_step
    kwargs = dict(loss="ppo_clip", loss_kwargs={"clip_eps": 0.2}, agg=agg, temperature=0.8)
    m_ref = ref.update(samples, **kwargs)
    after_ref = role_weights(backend, "actor")
    load_role_weights(backend, "actor", start)  # the module's backend back as it was

    learner = DataParallelLearner(2, SPEC, "actor", cfg, total_steps=4, seed=0)
    try:
        assert len(set(learner.pids)) == 2
        per_rank, totals, _ = learner.plan_chunks(samples)
        assert all(per_rank), "both ranks must get micro-batches"
        assert totals["seqs"] == 8  # zero-advantage / zero-weight samples count
        assert totals["tokens"] == sum(x.n_tokens for x in samples)  # trained tokens only
        # the ranks start from the very weights the single process started from
        for a, b in zip(learner.weights(), start):
            assert torch.equal(a, b)
        ray.get([r.set_keep_grads.remote(True) for r in learner.ranks])
        m_dp = learner.update(samples, **kwargs)
        grads = ray.get([r.get_last_grads.remote() for r in learner.ranks])
        after = [ray.get(r.weights.remote()) for r in learner.ranks]
    finally:
        learner.close()
    g_ref = captured[0]
    scale = max(float(g.abs().max()) for g in g_ref)
    assert scale > 0
    for rank_grads in grads:
        for g, gr in zip(rank_grads, g_ref):
            torch.testing.assert_close(g, gr, rtol=1e-4, atol=1e-6 * scale)
    # both replicas equal the single-process result. Adam's first step is lr * g / (|g| + eps):
    # where |g| is within the gradient tolerance above of 0, the step is as uncertain as the
    # gradient's sign (the two sums add the same terms in another order), so only there a
    # weight may differ by up to one step (lr); everywhere else to float precision.
    lr = cfg.lr
    for rank_after in after:
        moved = 0.0
        for w, wr, w0, gr in zip(rank_after, after_ref, start, g_ref):
            tiny = gr.abs() <= 1e-6 * scale
            torch.testing.assert_close(w[~tiny], wr[~tiny], rtol=1e-5, atol=1e-6)
            gap = (w - wr)[tiny].abs()
            assert gap.numel() == 0 or float(gap.max()) <= lr
            moved = max(moved, float((wr - w0).abs().max()))
        assert moved > 1e-4  # the step really moved the weights
    for k in ("loss", "grad_norm", "samples", "active_samples", "tokens", "model_tokens",
              "encoded_tokens"):
        assert m_dp[k] == pytest.approx(m_ref[k], rel=1e-5, abs=1e-7), k
    for k in m_ref:  # the trainer's wall-clock profile (time_*_s) is per process
        if k not in ("lr", "skipped") and not k.startswith("time_"):
            assert k in m_dp, k


def test_mini_batches_are_refused_before_ray_starts_anything():
    """The data-parallel learner takes one optimiser step per update: a config asking for more
    is refused by name (not silently trained with one step) — no cluster needed to see it."""
    from crl_bench.distributed.learner import DataParallelLearner
    from crl_bench.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"actor\.mini_batches=4: .*--set actor\.mini_batches=1"):
        DataParallelLearner(2, SPEC, "actor", OptimConfig(mini_batches=4), total_steps=4)
