"""``RoleTrainer.update`` on the tiny random model (SmolLM2's real tokenizer), real forward and
backward passes, real samples with their own sampling log-probs.

What is pinned, each against a gradient computed by hand in this file (one sample at a time, no
padding, no micro-batching, the per-token formulas written out here rather than imported):

- the accumulated gradient equals the gradient of the loss aggregated over the *whole* batch,
  zero-advantage and zero-weight samples included in the denominator (issue 16, bug 2; the
  official loss: ROLL's ``agg_loss`` over the whole batch, roll/utils/functionals.py:208 in
  pUmpKin-Co/ComplementaryRL ab2574f, with the count-aware weight folded into the advantage,
  roll/pipeline/agentic/multi_agentic_pipeline.py:1055-1057);
- any micro-batching (uneven chunks, token caps) gives the same gradient;
- advantage sign (positive-advantage tokens' log-probs rise after one update, negative ones
  fall) and scale (a weight-1/2 sample moves half as far, to first order);
- old log-probs aligned to the tokens they score (on-policy ratio exactly 1).
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_bench.llm.hf_backend import HFBackend  # noqa: E402
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.config.schema import OptimConfig  # noqa: E402
from crl_bench.training.role_trainer import RoleTrainer, TrainSample, _schedule_factor  # noqa: E402

QUESTIONS = ["Which way is north?", "Name a fruit.", "Count to three, please, slowly.",
             "What is 2+2?", "Say hi.", "Describe a room with a door and a staircase."]
TEMPERATURE = 0.8
CAPS = [9, 4, 7, 12, 5, 3]  # uneven completion lengths


@pytest.fixture(scope="module")
def backend():
    torch.set_num_threads(1)
    # full fine-tuning: every parameter gets a gradient (LoRA's B = 0 would hide A's)
    return HFBackend("tiny-random", roles=("actor",), lora=None, seed=0, dtype="float32",
                     device="cpu")


@pytest.fixture(scope="module")
def gens(backend):
    prompts = [backend.chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    prompts[2] = prompts[2] + prompts[0]  # uneven prompt lengths too
    out = backend.generate(prompts, SamplingParams(temperature=TEMPERATURE, max_new_tokens=12,
                                                   seed=11), max_new_tokens=CAPS)
    assert all(len(g.completion_ids) >= 2 for g in out)
    return out


@pytest.fixture()
def fresh(backend):
    """Restore the weights after a test that really updates them."""
    state = copy.deepcopy(backend.trainable_model("actor").state_dict())
    yield backend
    backend.trainable_model("actor").load_state_dict(state)


def samples_from(gens, advantages, weights=None, shift=None):
    """TrainSamples with the real sampling log-probs, optionally shifted per token
    (old = sampled - shift) so that ratio = exp(shift) is known exactly."""
    weights = weights or [1.0] * len(advantages)
    out = []
    for i, (g, a, w) in enumerate(zip(gens, advantages, weights)):
        old = list(g.logprobs)
        if shift is not None:
            old = [lp - shift(i, t) for t, lp in enumerate(old)]
        out.append(TrainSample(list(g.prompt_ids), list(g.completion_ids), old, a, w))
    return out


def params_of(backend):
    return [p for p in backend.trainable_parameters("actor") if p.requires_grad]


def trainer_grads(backend, samples, *, loss="ppo_clip", loss_kwargs=None, agg="token-mean",
                  mb=4, mb_tokens=0, temperature=TEMPERATURE):
    """The gradient the trainer accumulates in one update (lr 0: the weights do not move)."""
    cfg = OptimConfig(lr=0.0, max_grad_norm=1e9, micro_batch_size=mb, micro_batch_tokens=mb_tokens)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
    grads: dict[int, torch.Tensor] = {}
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p, i=i: grads.__setitem__(i, p.grad.detach().clone()))
        for i, p in enumerate(trainer.params)]
    try:
        metrics = trainer.update(samples, loss=loss, agg=agg, temperature=temperature,
                                 loss_kwargs=loss_kwargs if loss_kwargs is not None else {"clip_eps": 0.2})
    finally:
        for h in hooks:
            h.remove()
    return [grads.get(i, torch.zeros_like(p)) for i, p in enumerate(trainer.params)], metrics


def completion_logprobs(backend, s, temperature=TEMPERATURE):
    """log p(completion token t | prefix) for one sample, alone (no padding): logits at position
    j predict token j + 1, so the completion's tokens p..p+c-1 are read at p-1..p+c-2."""
    ids = torch.tensor([s.prompt_ids + s.completion_ids])
    lp = backend.forward_token_logprobs("actor", ids, torch.ones_like(ids), temperature=temperature)
    p, c = len(s.prompt_ids), len(s.completion_ids)
    return lp[0, p - 1:p + c - 1]


def per_token_loss(name, lp, old, adv, kw):
    r = torch.exp(lp - old)
    if name == "ppo_clip":
        # PPO (Schulman et al. 2017, eq. 7): -min(r A, clip(r, 1-eps, 1+eps_high) A)
        lo, hi = 1 - kw["clip_eps"], 1 + kw.get("clip_eps_high", kw["clip_eps"])
        return torch.maximum(-adv * r, -adv * r.clamp(lo, hi))
    # CISPO (MiniMax-M1 report, eq. 4-5; official memory_model_worker.py:438-465):
    # -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi
    w = r.detach().clamp(1 - kw["eps_low"], 1 + kw["eps_high"])
    return -w * adv * lp


def hand_grads(backend, samples, *, loss="ppo_clip", loss_kwargs=None, agg="token-mean",
               temperature=TEMPERATURE):
    """Gradient of the loss aggregated over every sample with a completion, by hand."""
    kw = loss_kwargs if loss_kwargs is not None else {"clip_eps": 0.2}
    params = params_of(backend)
    for p in params:
        p.grad = None
    per_sample = []
    for s in samples:
        lp = completion_logprobs(backend, s, temperature)
        old = torch.tensor(s.old_logprobs)
        per_sample.append(per_token_loss(loss, lp, old, s.advantage * s.weight, kw))
    if agg == "token-mean":
        total = torch.cat(per_sample).sum() / sum(len(t) for t in per_sample)
    elif agg == "seq-mean-token-mean":
        total = torch.stack([t.mean() for t in per_sample]).sum() / len(per_sample)
    else:  # seq-mean-token-sum
        total = torch.stack([t.sum() for t in per_sample]).sum() / len(per_sample)
    total.backward()
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    for p in params:
        p.grad = None
    return grads, float(total.detach())


def assert_grads_close(a, b, rtol=2e-4):
    flat_a = torch.cat([g.flatten() for g in a])
    flat_b = torch.cat([g.flatten() for g in b])
    scale = float(flat_b.abs().max())
    assert scale > 0, "the reference gradient is zero: the test would prove nothing"
    err = float((flat_a - flat_b).abs().max())
    assert err <= rtol * scale, f"max |diff| {err:.3g} vs max |grad| {scale:.3g}"


# advantages with both signs, zeros, and weights 1/2 and 0 (the count-aware cases)
ADV = [1.0, -0.5, 0.0, 0.7, 0.8, -1.2]
WEIGHTS = [1.0, 1.0, 1.0, 0.5, 0.0, 1.0]


def off_policy(i, t):
    """log(r) per token: spreads ratios over [0.67, 1.5] so both clip edges are crossed."""
    return [-0.4, 0.0, 0.1, -0.15, 0.12, 0.3, 0.05, -0.25, 0.4][(3 * i + t) % 9]


@pytest.mark.parametrize("loss,kw,agg", [
    ("ppo_clip", {"clip_eps": 0.2}, "token-mean"),
    ("ppo_clip", {"clip_eps": 0.2, "clip_eps_high": 0.28}, "seq-mean-token-mean"),
    ("cispo", {"eps_low": 0.3, "eps_high": 0.05}, "token-mean"),
    ("cispo", {"eps_low": 0.1, "eps_high": 0.2}, "seq-mean-token-sum"),
])
def test_gradient_is_the_whole_batch_loss_by_hand(backend, gens, loss, kw, agg):
    samples = samples_from(gens, ADV, WEIGHTS, shift=off_policy)
    want, want_loss = hand_grads(backend, samples, loss=loss, loss_kwargs=kw, agg=agg)
    got, m = trainer_grads(backend, samples, loss=loss, loss_kwargs=kw, agg=agg, mb=4)
    assert_grads_close(got, want)
    assert m["loss"] == pytest.approx(want_loss, rel=1e-4, abs=1e-7)
    assert m["samples"] == 6 and m["active_samples"] == 4 and m["skipped"] == 0
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in want))
    assert m["grad_norm"] == pytest.approx(norm, rel=1e-3)


def test_a_groups_shared_prompt_is_encoded_once_with_the_by_hand_gradient(backend):
    """GRPO groups (8 samples of one prompt each, two groups): in prompt order each group fills
    a micro-batch whose prompt the backend encodes once; the gradient is still the by-hand one
    of every sample alone, and the tokens run through the model drop by the shared prompts."""
    prompts = [backend.chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS[:2]]
    group = [prompts[i // 8] for i in range(16)]
    gens = backend.generate(group, SamplingParams(temperature=TEMPERATURE, max_new_tokens=6,
                                                  seed=4))
    adv = [(-1.0) ** i * (0.5 + i / 16) for i in range(16)]
    samples = samples_from(gens, adv, shift=off_policy)
    shuffled = samples[1::2] + samples[::2]  # groups interleaved, as a batch may come
    want, want_loss = hand_grads(backend, samples, loss="ppo_clip",
                                 loss_kwargs={"clip_eps": 0.2}, agg="token-mean")
    got, m = trainer_grads(backend, shuffled, mb=8)
    assert_grads_close(got, want)
    assert m["loss"] == pytest.approx(want_loss, rel=1e-4, abs=1e-7)
    # each group's prompt (all but its last token, which scores the first completion token)
    # runs once instead of 8 times
    saved = sum(7 * (len(p) - 1) for p in prompts)
    assert m["model_tokens"] - m["encoded_tokens"] == saved


def test_zero_advantage_and_zero_weight_samples_count_in_the_denominator(backend, gens):
    """Issue 16, bug 2: with token-mean, adding samples that carry no gradient scales the
    gradient by (active tokens / all tokens); dropping them first would leave it unchanged."""
    active = samples_from(gens[:2], [1.0, -0.5])
    idle = samples_from(gens[2:5], [0.0, 0.9, 0.0], weights=[1.0, 0.0, 1.0])
    g_active, _ = trainer_grads(backend, active)
    g_all, m = trainer_grads(backend, active + idle)
    assert m["active_samples"] == 2 and m["samples"] == 5
    n_active = sum(len(s.completion_ids) for s in active)
    n_all = n_active + sum(len(s.completion_ids) for s in idle)
    assert n_all > n_active
    assert_grads_close(g_all, [g * (n_active / n_all) for g in g_active])
    # sequence mean: 2 of 5 sequences carry the gradient
    g_active, _ = trainer_grads(backend, active, agg="seq-mean-token-mean")
    g_all, _ = trainer_grads(backend, active + idle, agg="seq-mean-token-mean")
    assert_grads_close(g_all, [g * (2 / 5) for g in g_active])


@pytest.mark.parametrize("mb,mb_tokens", [(1, 0), (2, 0), (5, 0), (100, 0), (4, 60)])
def test_micro_batching_gives_the_full_batch_gradient(backend, gens, mb, mb_tokens):
    samples = samples_from(gens, ADV, WEIGHTS, shift=off_policy)
    full, m_full = trainer_grads(backend, samples, mb=100)
    got, m = trainer_grads(backend, samples, mb=mb, mb_tokens=mb_tokens)
    assert_grads_close(got, full, rtol=5e-5)
    assert m["loss"] == pytest.approx(m_full["loss"], rel=1e-5, abs=1e-8)  # summed over chunks
    assert m["clip_frac"] == pytest.approx(m_full["clip_frac"], abs=1e-6)
    # and the same with the sequence mean (each chunk's share is its number of sequences)
    full, _ = trainer_grads(backend, samples, mb=100, agg="seq-mean-token-mean")
    got, _ = trainer_grads(backend, samples, mb=mb, mb_tokens=mb_tokens, agg="seq-mean-token-mean")
    assert_grads_close(got, full, rtol=5e-5)


def test_old_logprobs_are_aligned_to_the_tokens_they_score(backend, gens):
    """On-policy samples (old = the sampler's own log-probs, same temperature): every ratio is 1,
    nothing is clipped, and the gradient is the plain policy gradient -A grad log pi / tokens."""
    samples = samples_from(gens, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    got, m = trainer_grads(backend, samples, loss_kwargs={"clip_eps": 0.01})
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["clip_frac"] == 0.0
    # the same gradient as REINFORCE on the sampled tokens
    params = params_of(backend)
    n = sum(len(s.completion_ids) for s in samples)
    total = sum(-s.advantage * completion_logprobs(backend, s).sum() for s in samples) / n
    total.backward()
    want = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    assert_grads_close(got, want)


def test_wrong_temperature_shows_in_the_ratio(backend, gens):
    samples = samples_from(gens, [1.0] * 6)
    _, m = trainer_grads(backend, samples, temperature=1.0)  # sampled at 0.8
    # the random model is nearly uniform, so the gap is small, but 10x the on-policy one
    assert abs(m["ratio_mean"] - 1.0) > 1e-3 and m["approx_kl"] > 1e-6


def mean_logprob(backend, s):
    with torch.no_grad():
        return float(completion_logprobs(backend, s).mean())


def test_one_update_raises_positive_and_lowers_negative_logprobs(fresh, gens):
    """A real AdamW step: tokens with positive advantage become more likely, negative less."""
    backend = fresh
    samples = samples_from(gens, [1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    before = [mean_logprob(backend, s) for s in samples]
    cfg = OptimConfig(lr=1e-3, max_grad_norm=1.0)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
    m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       temperature=TEMPERATURE)
    assert m["grad_norm"] > 0 and m["skipped"] == 0 and trainer.updates == 1
    after = [mean_logprob(backend, s) for s in samples]
    for s, b, a in zip(samples, before, after):
        if s.advantage > 0:
            assert a > b + 1e-4, (b, a)
        else:
            assert a < b - 1e-4, (b, a)


def sgd_move(backend, samples, lr=1e-2):
    """Change of each sample's summed log-prob after one plain-SGD step through the trainer."""
    state = copy.deepcopy(backend.trainable_model("actor").state_dict())
    before = [mean_logprob(backend, s) for s in samples]
    cfg = OptimConfig(lr=lr, max_grad_norm=1e9)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
    # plain SGD: the step is lr x gradient, so the move is linear in the advantage x weight
    # (Adam would normalise the scale away)
    trainer.optimizer = torch.optim.SGD(trainer.params, lr=lr)
    trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2}, temperature=TEMPERATURE)
    after = [mean_logprob(backend, s) for s in samples]
    backend.trainable_model("actor").load_state_dict(state)
    return [a - b for a, b in zip(after, before)]


def test_a_half_weight_sample_moves_half_as_far(fresh, gens):
    full = sgd_move(fresh, samples_from(gens[:1], [1.0], [1.0]) + samples_from(gens[1:3], [0.0, 0.0]))
    half = sgd_move(fresh, samples_from(gens[:1], [1.0], [0.5]) + samples_from(gens[1:3], [0.0, 0.0]))
    assert full[0] > 0
    assert half[0] == pytest.approx(0.5 * full[0], rel=0.05)
    # and the gradient itself is exactly half
    g1, _ = trainer_grads(fresh, samples_from(gens[:1], [1.0], [1.0]))
    g2, _ = trainer_grads(fresh, samples_from(gens[:1], [1.0], [0.5]))
    assert_grads_close(g2, [g * 0.5 for g in g1], rtol=1e-5)


def test_nothing_to_learn_is_skipped_and_leaves_the_weights(fresh, gens):
    backend = fresh
    before = [p.detach().clone() for p in params_of(backend)]
    trainer = RoleTrainer(backend, "actor", OptimConfig(lr=1e-2), total_steps=1)
    samples = samples_from(gens[:3], [0.0, 1.0, -1.0], weights=[1.0, 0.0, 0.0])
    samples.append(TrainSample([1, 2], [], [], 1.0))  # empty completion: not a sample
    m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2})
    assert m == {"samples": 3.0, "active_samples": 0.0, "loss": 0.0, "grad_norm": 0.0, "skipped": 1.0}
    assert trainer.updates == 0
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(backend)))


def test_update_moves_the_weights_and_clips_the_norm(fresh, gens):
    backend = fresh
    before = [p.detach().clone() for p in params_of(backend)]
    cfg = OptimConfig(lr=1e-3, max_grad_norm=1e-3, warmup_steps=4)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=10)
    trainer.optimizer = torch.optim.SGD(trainer.params, lr=cfg.lr)
    samples = samples_from(gens, ADV, WEIGHTS)
    grads, _ = trainer_grads(backend, samples)
    m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       temperature=TEMPERATURE)
    assert m["grad_norm"] > 1e-3  # the norm before clipping is reported
    assert m["lr"] == pytest.approx(1e-3 / 4)  # warm-up step 0 of 4
    assert m["tokens"] == sum(len(g.completion_ids) for g in gens)
    # SGD step = lr x clipped gradient: -lr/4 * g * (1e-3 / |g|)
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    for b, p, g in zip(before, params_of(backend), grads):
        want = b - (1e-3 / 4) * g * (1e-3 / (norm + 1e-6))
        torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-9)


def test_max_samples_per_update_trains_a_subset(backend, gens):
    samples = samples_from(gens, [1.0] * 6)
    cfg = OptimConfig(lr=0.0, max_samples_per_update=2)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1, seed=3)
    m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       temperature=TEMPERATURE)
    assert m["samples"] == 2 and m["active_samples"] == 2
    state = trainer.state_dict()
    assert state["updates"] == 1
    other = RoleTrainer(backend, "actor", cfg, total_steps=1, seed=99)
    other.load_state_dict(state)
    assert other.updates == 1 and other._rng.getstate() == trainer._rng.getstate()
    # the optimiser's moments come back too
    mine, theirs = trainer.optimizer.state_dict()["state"], other.optimizer.state_dict()["state"]
    assert mine and mine.keys() == theirs.keys()
    for k in mine:
        assert torch.equal(mine[k]["exp_avg"], theirs[k]["exp_avg"])


def test_log_prob_count_must_match_the_completion(backend, gens):
    g = gens[0]
    bad = TrainSample(list(g.prompt_ids), list(g.completion_ids), list(g.logprobs)[:-1], 1.0)
    trainer = RoleTrainer(backend, "actor", OptimConfig(lr=0.0), total_steps=1)
    with pytest.raises(ValueError, match="log-probs for"):
        trainer.update([bad], loss="ppo_clip", loss_kwargs={"clip_eps": 0.2})


def test_schedule_factor_by_hand():
    cfg = OptimConfig(warmup_steps=4)
    assert [_schedule_factor(s, cfg, 10) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = OptimConfig(warmup_steps=2, schedule="cosine")
    # after warm-up: 0.5 (1 + cos(pi (step - 2) / 8)), 8 = 10 - 2 steps
    for step in (2, 4, 6, 10, 12):
        want = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 2) / 8)))
        assert _schedule_factor(step, cos, 10) == pytest.approx(want)
    assert _schedule_factor(6, cos, 10) == pytest.approx(0.5)
    assert _schedule_factor(5, OptimConfig(), 10) == 1.0
    # one step after warm-up: span 1, so the next step is already at the end of the cosine
    short = OptimConfig(warmup_steps=2, schedule="cosine")
    assert _schedule_factor(2, short, 3) == pytest.approx(1.0)
    assert _schedule_factor(3, short, 3) == pytest.approx(0.0, abs=1e-12)
    # no steps left after warm-up (span floored at 1): still ends at 0, no division by zero
    assert _schedule_factor(3, short, 2) == pytest.approx(0.0, abs=1e-12)


def test_defaults_counters_and_cosine_lr_over_updates(fresh, gens):
    """Default seed 0 (reproducible subsets), default temperature 1, the update counter, and the
    cosine learning rate read from total_steps."""
    import random

    backend = fresh  # the last update really moves the weights
    cfg = OptimConfig(lr=0.0, schedule="cosine", max_samples_per_update=6)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=4)
    assert trainer._rng.getstate() == random.Random(0).getstate()
    samples = samples_from(gens, [1.0] * 6)
    for _ in range(3):
        m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2})
    assert trainer.updates == 3
    # exactly max_samples_per_update samples: all used, no subset drawn (the rng is untouched)
    assert m["samples"] == 6 and trainer._rng.getstate() == random.Random(0).getstate()
    # default temperature is 1.0: the same ratios as passing 1.0
    _, m1 = trainer_grads(backend, samples, temperature=1.0)
    assert m["ratio_mean"] == pytest.approx(m1["ratio_mean"], abs=1e-6)
    assert abs(m["ratio_mean"] - 1.0) > 1e-3  # sampled at 0.8
    # the 4th update (step 3 of 4) is at cosine factor 0.5 (1 + cos(3 pi / 4))
    cfg.lr = 1e-3
    m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       temperature=TEMPERATURE)
    assert m["lr"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 3 / 4)))


def test_mini_batches_take_one_step_each_against_the_playing_policy(fresh, gens):
    """mini_batches=3: the 6 samples are split into 3 disjoint mini-batches of 2, one AdamW step
    each (the optimiser's step count is 3, the update count 1); the later mini-batches' ratios
    are against the sampler's log-probs, so they are no longer 1 (PPO's clipping applies); the
    signs hold (positive advantage up, negative down)."""
    backend = fresh
    samples = samples_from(gens, [1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    before = [mean_logprob(backend, s) for s in samples]
    cfg = OptimConfig(lr=1e-3, max_grad_norm=1.0, mini_batches=3)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1, seed=5)
    m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       temperature=TEMPERATURE)
    assert m["optimizer_steps"] == 3 and m["samples"] == 6 and m["active_samples"] == 6
    assert trainer.updates == 1
    steps = {int(v["step"]) for v in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {3}
    assert m["ratio_max"] > 1.0 + 1e-4   # a mean over the 3 steps: the later ones moved
    after = [mean_logprob(backend, s) for s in samples]
    for s, b, a in zip(samples, before, after):
        assert (a > b + 1e-4) if s.advantage > 0 else (a < b - 1e-4), (s.advantage, b, a)
    # one mini-batch: the same result as the default path (one step, no shuffle)
    one = RoleTrainer(backend, "actor", OptimConfig(lr=0.0, mini_batches=1), total_steps=1, seed=5)
    m1 = one.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2}, temperature=TEMPERATURE)
    assert "optimizer_steps" not in m1 and m1["samples"] == 6


def checkpointed_update(backend, samples, on):
    """(gradient, calls of a decoder layer's MLP) of one update."""
    cfg = OptimConfig(lr=0.0, max_grad_norm=1e9, micro_batch_size=2, activation_checkpointing=on)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
    captured, calls = [], []
    step = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (captured.append(
        [p.grad.detach().clone() for p in trainer.params]), step(*a, **k))
    mlp = backend.trainable_model("actor").model.layers[0].mlp
    forward = mlp.forward
    mlp.forward = lambda *a, **k: (calls.append(1), forward(*a, **k))[1]
    try:
        trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       temperature=TEMPERATURE)
    finally:
        del mlp.forward
    return captured[0], len(calls)


def test_activation_checkpointing_recomputes_the_layers_for_the_same_gradient(backend, gens):
    """``activation_checkpointing``: each decoder layer runs again in the backward (instead of
    keeping its activations from the forward), the accumulated gradient is the one without it,
    and the model is back in eval mode (generation) afterwards."""
    samples = samples_from(gens, ADV, WEIGHTS, shift=off_policy)
    plain, _ = checkpointed_update(backend, samples, False)  # prompt prefixes shared
    got, calls = checkpointed_update(backend, samples, True)  # not (see RoleTrainer.begin_step)
    assert backend.share_prompt_prefix
    backend.share_prompt_prefix = False
    try:
        _, calls_plain = checkpointed_update(backend, samples, False)
    finally:
        backend.share_prompt_prefix = True
    assert calls_plain > 0 and calls == 2 * calls_plain
    assert not backend.trainable_model("actor").training
    assert_grads_close(got, plain, rtol=1e-5)
