"""Full multi-turn conversations and trajectory-level training (issue 16.5/16.9/16.10/16.11/16.14,
issue 18.1), on the repo's tiny models, real MiniHack envs, real sampling and real updates.

Pinned by effect:
- a "full" conversation's turn t prompt is turn t-1's prompt + completion + the template's
  assistant close + the next user message, token for token, and decodes to exactly what the
  tokenizer's own chat template renders for that conversation;
- a trajectory-level sample masks exactly each turn's completion tokens, with the sampling
  log-probs aligned (on-policy ratio 1 to sampler precision);
- its gradient equals the per-turn samples' gradient (token-mean: the same tokens in the same
  contexts), and micro-batched == whole-batch == by hand for seq-mean-token-mean;
- recomputed old log-probs make the ratio exactly 1;
- Search-and-Ask is not offered to without-experience episodes;
- top_k is honoured by the HF sampler.
"""

from __future__ import annotations

import copy

import gymnasium
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("nle")

import crl_bench  # noqa: E402,F401  (registers the crl/ envs)
from crl_bench.llm.hf_backend import HFBackend  # noqa: E402
from crl_bench.llm.prompting import build_messages, conversation_template  # noqa: E402
from crl_bench.llm.rollout import EpisodeSpec, PromptConfig, RolloutEngine  # noqa: E402
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.config.schema import OptimConfig, build_config, ConfigError  # noqa: E402
from crl_bench.training.role_trainer import RoleTrainer, TrainSample  # noqa: E402

ROOM = "crl/MiniHack-Room-5x5-v0"
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def backend():
    torch.set_num_threads(1)
    # full fine-tuning: every parameter gets a gradient
    return HFBackend("tiny-sft", roles=("actor",), lora=None, seed=0, dtype="float32", device="cpu")


def play(backend, n=4, *, conversation="full", max_turns=4, seed=5, **prompt):
    engine = RolloutEngine(backend, SamplingParams(temperature=TEMPERATURE, max_new_tokens=12,
                                                   seed=seed),
                           PromptConfig.for_small_model(max_turns=max_turns,
                                                        conversation=conversation, **prompt))
    specs = [EpisodeSpec(env=gymnasium.make(ROOM), seed=i % 2, group_id=i % 2) for i in range(n)]
    return engine.run(specs)


@pytest.fixture(scope="module")
def episodes(backend):
    trajs = play(backend)
    assert sum(len(t.turns) >= 3 for t in trajs) >= 2, "need multi-turn episodes to test anything"
    return trajs


def test_each_prompt_extends_the_previous_turn_token_for_token(backend, episodes):
    close, head, tail = conversation_template(backend.tokenizer)
    tok = backend.tokenizer
    for traj in episodes:
        for prev, turn in zip(traj.turns, traj.turns[1:]):
            before = prev.prompt_ids + prev.completion_ids
            assert turn.prompt_ids[:len(before)] == before
            inserted = tok.decode(turn.prompt_ids[len(before):])
            # what the model saw next: the close of its message, then the observation it got
            assert inserted.startswith(close if not prev.completion_ids[-1] == tok.eos_token_id
                                       else close[len(tok.eos_token):])
            assert prev.observation.strip().splitlines()[0] in inserted
            assert inserted.endswith(tail + "<answer>")


def test_the_conversation_is_what_the_chat_template_renders(backend, monkeypatch):
    """decode(turn t prompt) == the tokenizer's chat template applied to (system, user,
    assistant, user, ...) with the sampled completions and the engine's follow-up messages."""
    import crl_bench.llm.rollout as rollout_mod

    follow_ups: list[str] = []
    real = rollout_mod.build_followup_message

    def spy(*args, **kwargs):
        follow_ups.append(real(*args, **kwargs))
        return follow_ups[-1]

    monkeypatch.setattr(rollout_mod, "build_followup_message", spy)
    [traj] = play(backend, 1, max_turns=4, seed=7)
    assert len(traj.turns) >= 3 and len(follow_ups) == len(traj.turns) - 1
    tok = backend.tokenizer
    cfg = PromptConfig.for_small_model(max_turns=4, conversation="full")
    obs, info = gymnasium.make(ROOM).reset(seed=0)
    messages = build_messages(cfg, family="minihack", goal=info["goal"], observation=obs,
                              history=[], admissible_actions=info.get("admissible_actions"))
    for k, turn in enumerate(traj.turns):
        if k:
            prev = traj.turns[k - 1]
            messages = messages + [
                {"role": "assistant", "content": "<answer>" + prev.completion_text},
                {"role": "user", "content": follow_ups[k - 1]}]
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert tok.decode(turn.prompt_ids) == rendered + "<answer>"


def test_trajectory_sample_masks_every_completion_with_its_logprobs(backend, episodes):
    for traj in episodes:
        s = TrainSample.from_turns(traj.turns, 1.0)
        seq = s.prompt_ids + s.completion_ids
        assert s.prompt_ids == traj.turns[0].prompt_ids
        assert seq == traj.turns[-1].prompt_ids + traj.turns[-1].completion_ids
        masked = [tok for tok, m in zip(s.completion_ids, s.completion_mask) if m]
        assert masked == [t for turn in traj.turns for t in turn.completion_ids]
        assert s.old_logprobs == [lp for turn in traj.turns for lp in turn.logprobs]
        assert s.n_tokens == sum(len(t.completion_ids) for t in traj.turns)
    # the recorded log-probs sit on the tokens they score: the trainer's ratio is 1 on-policy
    samples = [TrainSample.from_turns(t.turns, 1.0) for t in episodes]
    trainer = RoleTrainer(backend, "actor", OptimConfig(lr=0.0, micro_batch_size=8), total_steps=1)
    m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                       temperature=TEMPERATURE)
    assert abs(m["ratio_mean"] - 1) < 1e-4 and m["ratio_max"] < 1 + 1e-3
    assert m["n_tokens"] == sum(s.n_tokens for s in samples)


def test_a_window_episode_is_not_a_trajectory_sample(backend):
    [traj] = play(backend, 1, conversation="window", max_turns=3)
    assert len(traj.turns) >= 2  # the fixed seed plays several turns (else nothing is checked)
    with pytest.raises(ValueError, match="conversation: full"):
        TrainSample.from_turns(traj.turns, 1.0)


def _grads(backend, samples, *, agg, mb, recompute=False, shift=0.0):
    cfg = OptimConfig(lr=0.0, max_grad_norm=1e9, micro_batch_size=mb,
                      recompute_old_logprobs=recompute)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
    grads = {}
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p, i=i: grads.__setitem__(i, p.grad.detach().clone()))
        for i, p in enumerate(trainer.params)]
    try:
        m = trainer.update(samples, loss="ppo_clip", agg=agg, temperature=TEMPERATURE,
                           loss_kwargs={"clip_eps": 0.2})
    finally:
        for h in hooks:
            h.remove()
    flat = torch.cat([grads.get(i, torch.zeros_like(p)).flatten()
                      for i, p in enumerate(trainer.params)])
    return flat, m


def _close(a, b, rtol=2e-4):
    scale = float(b.abs().max())
    assert scale > 0, "zero reference gradient proves nothing"
    assert float((a - b).abs().max()) <= rtol * scale


def _advantages(episodes):
    return [(-1.0) ** k * (0.5 + 0.25 * k) for k in range(len(episodes))]


def test_trajectory_gradient_equals_the_per_turn_gradient_token_mean(backend, episodes):
    adv = _advantages(episodes)
    traj_samples = [TrainSample.from_turns(t.turns, a) for t, a in zip(episodes, adv)]
    turn_samples = [TrainSample(u.prompt_ids, u.completion_ids, u.logprobs, a)
                    for t, a in zip(episodes, adv) for u in t.turns]
    g_traj, m_traj = _grads(backend, traj_samples, agg="token-mean", mb=8)
    g_turn, m_turn = _grads(backend, turn_samples, agg="token-mean", mb=8)
    _close(g_traj, g_turn)
    assert m_traj["tokens"] == m_turn["tokens"]
    # the shared prefix is encoded once: far fewer tokens go through the model
    assert sum(s.length for s in traj_samples) < sum(s.length for s in turn_samples)


def test_seq_mean_token_mean_micro_batched_equals_whole_batch_and_hand(backend, episodes):
    adv = _advantages(episodes)
    # an idle (advantage 0) episode still counts in the sequence denominator
    adv[-1] = 0.0
    samples = [TrainSample.from_turns(t.turns, a) for t, a in zip(episodes, adv)]
    whole, _ = _grads(backend, samples, agg="seq-mean-token-mean", mb=len(samples))
    for mb in (1, 2, 3):
        part, _ = _grads(backend, samples, agg="seq-mean-token-mean", mb=mb)
        _close(part, whole, rtol=1e-5)
    # by hand: each episode alone, mean of its masked tokens' PPO terms, mean over episodes
    params = [p for p in backend.trainable_parameters("actor") if p.requires_grad]
    for p in params:
        p.grad = None
    terms = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        lp = backend.forward_token_logprobs("actor", ids, torch.ones_like(ids),
                                            temperature=TEMPERATURE)[0]
        pos = [len(s.prompt_ids) + j - 1 for j, m in enumerate(s.completion_mask) if m]
        r = torch.exp(lp[pos] - torch.tensor(s.old_logprobs))
        per_tok = torch.maximum(-s.advantage * r, -s.advantage * r.clamp(0.8, 1.2))
        terms.append(per_tok.mean())
    (torch.stack(terms).sum() / len(samples)).backward()
    hand = torch.cat([p.grad.flatten() for p in params])
    for p in params:
        p.grad = None
    _close(whole, hand)


def test_recomputed_old_logprobs_make_the_ratio_exactly_one(backend, episodes):
    adv = _advantages(episodes)
    # the recorded log-probs are shifted by 0.3: used as "old", the ratio is exp(0.3) != 1
    shifted = []
    for t, a in zip(episodes, adv):
        s = TrainSample.from_turns(t.turns, a)
        s.old_logprobs = [x - 0.3 for x in s.old_logprobs]
        shifted.append(s)
    _, m_sampler = _grads(backend, shifted, agg="seq-mean-token-mean", mb=2)
    assert m_sampler["ratio_mean"] > 1.3
    _, m = _grads(backend, shifted, agg="seq-mean-token-mean", mb=2, recompute=True)
    assert m["ratio_mean"] == 1.0 and m["ratio_max"] == 1.0 and m["clip_frac"] == 0.0


def test_search_and_ask_is_offered_only_with_experience(backend):
    asked = []
    engine = RolloutEngine(backend, SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, seed=1),
                           PromptConfig(max_turns=2, max_asks=2, conversation="full"),
                           ask_callback=lambda q, spec, ctx: asked.append(q) or "advice",
                           ask_requires_experience=True)
    specs = [EpisodeSpec(env=gymnasium.make(ROOM), seed=0, with_experience=w, experience_text=e)
             for w, e in ((True, "Go to the stairs."), (False, ""))]
    with_exp, without = engine.run(specs)
    tok = backend.tokenizer
    assert "<ask>" in tok.decode(with_exp.turns[0].prompt_ids)
    for turn in without.turns:
        text = tok.decode(turn.prompt_ids)
        assert "<ask>" not in text and "advice" not in text
    # and a forced ask in a without-experience episode is not an ask
    from crl_bench.llm.prompting import parse_completion

    assert engine._asks_left(engine._start(EpisodeSpec(env=gymnasium.make(ROOM), seed=0))) == 0
    assert parse_completion("<ask>where?</ask>", engine.prompt, 0).kind == "invalid"


def test_top_k_one_is_greedy(backend):
    prompts = [backend.chat_prompt_ids([{"role": "user", "content": q}])
               for q in ("Which way is north?", "Name a fruit.")]
    greedy = backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=10))
    topk1 = backend.generate(prompts, SamplingParams(temperature=1.5, top_k=1, max_new_tokens=10,
                                                     seed=3))
    free = backend.generate(prompts, SamplingParams(temperature=1.5, max_new_tokens=10, seed=3))
    assert [g.completion_ids for g in topk1] == [g.completion_ids for g in greedy]
    assert [g.completion_ids for g in free] != [g.completion_ids for g in greedy]


def test_paper_preset_and_config_switches():
    from crl_bench.config.schema import PRESETS

    cfg = PRESETS["paper"]()
    assert cfg.rollout.conversation == "full" and cfg.rollout.max_new_tokens == 4096
    assert cfg.rollout.top_k == 100
    assert cfg.actor.sample_unit == "trajectory" and cfg.actor.agg == "seq-mean-token-mean"
    assert cfg.actor.recompute_old_logprobs
    for name in ("tiny", "cpu"):
        c = PRESETS[name]()
        assert (c.rollout.conversation, c.actor.sample_unit) == ("window", "turn")
    with pytest.raises(ConfigError, match="conversation=full"):
        build_config(agent="grpo", tasks="minihack", preset="tiny",
                     overrides={"actor.sample_unit": "trajectory"})
    with pytest.raises(ConfigError, match="rollout.conversation"):
        build_config(agent="grpo", tasks="minihack", preset="tiny",
                     overrides={"rollout.conversation": "all"})


def test_tiny_run_with_full_conversations_and_trajectory_samples(tmp_path):
    """grpo end to end with the official actor settings: the update trains whole episodes."""
    import json

    from crl_bench.runner.api import run_experiment

    run_experiment("grpo", "minihack", "tiny", 0, tmp_path / "run", steps=1, progress=False,
                   overrides={"threads": 1, "rollout.conversation": "full",
                              "actor.sample_unit": "trajectory", "actor.agg": "seq-mean-token-mean",
                              "actor.recompute_old_logprobs": True, "rollout.top_k": 100,
                              "eval.at_start": False, "eval.episodes_per_task": 1})
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "losses/actor_samples" in r]
    assert train, rows
    r = train[-1]
    # one sample per episode (G x K = 2 x 4), ratio exactly 1 at the update
    assert r["losses/actor_samples"] == 8.0
    if r.get("losses/actor_skipped", 0.0) == 0.0:
        assert r["losses/actor_ratio_mean"] == 1.0


def test_kv_kept_across_turns_gives_the_same_episodes(backend):
    """The HF backend keeps each episode's KV between turns of a full conversation: only the new
    tokens are prefilled, and the episodes (sampled tokens, log-probs) are those without it."""
    runs = {}
    for reuse in (False, True):
        engine = RolloutEngine(backend, SamplingParams(temperature=1.0, max_new_tokens=10, seed=3),
                               PromptConfig.for_small_model(max_turns=4, conversation="full"))
        engine.reuse_kv = reuse
        backend.kv_stats = {"reused_tokens": 0, "prefilled_tokens": 0}
        runs[reuse] = engine.run([EpisodeSpec(env=gymnasium.make(ROOM), seed=i) for i in range(4)])
        runs[reuse, "stats"] = dict(backend.kv_stats)
    assert runs[False, "stats"]["reused_tokens"] == 0
    reused, prefilled = runs[True, "stats"]["reused_tokens"], runs[True, "stats"]["prefilled_tokens"]
    assert reused > 2 * prefilled  # most of each later prompt came from the kept KV
    assert backend._kv_store == {} or all(not v for v in backend._kv_store.values())  # dropped
    for a, b in zip(runs[False], runs[True]):
        assert [t.completion_ids for t in a.turns] == [t.completion_ids for t in b.turns]
        for u, v in zip(a.turns, b.turns):
            assert u.prompt_ids == v.prompt_ids
            assert max(abs(x - y) for x, y in zip(u.logprobs, v.logprobs)) < 1e-4
