"""Log-probs over chunks of the sequence (``actor.logprob_chunk_tokens``): the same values,
entropies and gradients as all scored tokens at once (fp32 tolerance), with prompt-prefix sharing
on and off, LoRA and full fine-tuning; a RoleTrainer update with chunks equals one without; and
the chunked backward never holds the logits of all scored tokens at once."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_bench.llm.hf_backend import HFBackend  # noqa: E402
from crl_bench.llm.types import LoraSpec  # noqa: E402


def batch(share_prefix: bool):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 49000, (3, 40), generator=g)
    if share_prefix:
        ids[:, :12] = ids[0, :12]  # a GRPO group's prompt: encoded once
    attn = torch.ones_like(ids)
    attn[2, :6] = 0  # left padding
    score = torch.zeros(3, 39, dtype=torch.bool)
    score[:, 15:] = True  # the completion positions
    score[1, 30:] = False
    return ids, attn, score


def grads_of(backend, role, **kw):
    ids, attn, score = batch(kw.pop("share"))
    params = list(backend.trainable_parameters(role))
    for p in params:
        p.grad = None
    lp, ent = backend.forward_token_logprobs(role, ids, attn, temperature=0.7, score_mask=score,
                                             return_entropy=True, **kw)
    weights = torch.linspace(-1, 1, lp.numel()).view_as(lp)
    (lp * weights).sum().backward()
    return lp.detach(), ent.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("lora,share", [(None, False), (LoraSpec(r=4, alpha=8), True)])
def test_chunked_equals_unchunked(lora, share):
    torch.set_num_threads(1)
    backend = HFBackend("tiny-random", roles=("actor",), lora=lora, seed=0, dtype="float32",
                        device="cpu", share_prompt_prefix=share)
    lp0, ent0, g0 = grads_of(backend, "actor", share=share)
    lp1, ent1, g1 = grads_of(backend, "actor", share=share, chunk_tokens=7)  # 63 tokens: 9 chunks
    assert (lp0 != 0).sum() == 63
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent1, ent0, rtol=1e-5, atol=1e-6)
    scale = max(float(g.abs().max()) for g in g0)
    assert scale > 0
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * scale)
    # the output layer is back: an unchunked call gives the first result again
    lp2, _, _ = grads_of(backend, "actor", share=share)
    torch.testing.assert_close(lp2, lp0, rtol=0, atol=0)
    # no score mask (every valid position) chunked equals unchunked too
    ids, attn, _ = batch(share)
    with torch.no_grad():
        a = backend.forward_token_logprobs("actor", ids, attn)
        b = backend.forward_token_logprobs("actor", ids, attn, chunk_tokens=16)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_trainer_update_with_chunks_equals_without():
    from crl_bench.config.schema import OptimConfig
    from crl_bench.training.role_trainer import RoleTrainer, TrainSample

    torch.set_num_threads(1)
    samples = [TrainSample(list(range(100 + k, 110 + k)), list(range(300 + 3 * k, 312 + 3 * k)),
                           [-10.8] * 12, [1.0, -0.5, 0.75, -1.0][k]) for k in range(4)]
    after = []
    for chunk in (0, 5):
        backend = HFBackend("tiny-random", roles=("actor",), lora=None, seed=0, dtype="float32",
                            device="cpu")
        cfg = OptimConfig(lr=1e-3, micro_batch_size=2, logprob_chunk_tokens=chunk,
                          recompute_old_logprobs=True)
        trainer = RoleTrainer(backend, "actor", cfg, total_steps=2, seed=0)
        m = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2})
        after.append(([p.detach().clone() for p in trainer.params], m))
    (w0, m0), (w1, m1) = after
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-4)
    for a, b in zip(w1, w0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_chunked_backward_never_holds_every_scored_tokens_logits():
    """Every vocabulary-wide tensor the output layer produces (forward, and the backward's
    recomputation) and every one autograd keeps for the backward is one chunk's rows at most,
    where the unchunked path keeps the [scored tokens, vocab] logits."""
    torch.set_num_threads(1)
    backend = HFBackend("tiny-random", roles=("actor",), lora=None, seed=0, dtype="float32",
                        device="cpu")
    model = backend.trainable_model("actor")
    vocab = model.config.vocab_size
    ids, attn, score = batch(False)

    def largest_vocab_rows(**kw):
        made, kept = [0], [0]

        weight = model.get_output_embeddings().weight.data_ptr()

        def pack(t):  # a tensor autograd keeps; the output layer's weight (transposed) aside
            if (t.dim() >= 1 and t.shape[-1] == vocab and t.dtype.is_floating_point
                    and t.data_ptr() != weight):
                kept.append(t.numel() // vocab)
            return t

        hook = model.get_output_embeddings().register_forward_hook(
            lambda mod, args, out: made.append(out.numel() // vocab))
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                lp = backend.forward_token_logprobs("actor", ids, attn, score_mask=score, **kw)
            lp.sum().backward()
        finally:
            hook.remove()
        return max(made), max(kept), len(made) - 1

    assert largest_vocab_rows() == (63, 63, 1)  # every scored token's logits at once
    made, kept, calls = largest_vocab_rows(chunk_tokens=8)
    assert made <= 8 and kept <= 8
    assert calls == 2 * 8  # 8 chunks, each recomputed once in the backward
