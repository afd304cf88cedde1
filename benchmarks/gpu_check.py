"""One-command GPU check that decides (< 8 min on one H100/H200), one summary at the end; exits
non-zero on any FAIL or error.

    python benchmarks/gpu_check.py                 # on a GPU machine: torch, transformers, peft
    python benchmarks/gpu_check.py --smoke         # CPU, tiny shapes (the tests run this)

It imports nothing the GPU device's image lacks (no gymnasium, Ray or vLLM:
tests/test_gpu_check_closure.py checks the import closure statically,
``benchmarks/gpu_check_venv.sh`` runs the smoke mode in a venv with only torch, transformers and
peft). Sections (each timed; a failing section is reported and the others still run):

1. ``master_update``: the trainer's mixed precision. A random-init Qwen2 model in bf16 trained by
   ``RoleTrainer`` (AdamW at lr 1e-6, one update): the weights the optimiser steps must move as
   an fp32 AdamW step from the same weights with the same gradient does (relative error <= 1e-2,
   >= 99% of the entries the reference changes changed). A trainer stepping the bf16 weights
   themselves fails it (a 1e-6 step is below half a bf16 ulp of most weights).
2. ``learner``: the project's :class:`~crl_bench.distributed.fsdp.ShardedLearner` on one rank of a
   process group built by the learners' own :func:`~crl_bench.distributed.learner.join_group`
   (NCCL for CUDA tensors, gloo for CPU ones), on a random-init model of Qwen2.5-7B's shape
   (``--layers``, default 20 of its 28 decoder layers: the whole 7B's fp32 states, 122 GB, leave
   no room for a 32k-token update on one 141 GB GPU), bf16 compute over fp32 sharded masters,
   with the ``paper`` preset's memory settings: activation checkpointing, log-probs over chunks
   of 4,096 tokens, one micro-batch per trajectory, the old log-probs recomputed before the
   update (``recompute_old_logprobs``). One update on one 32,768-token trajectory. Reports
   tokens/s and MFU = (10 N + attention) FLOPs per token (6 N forward and backward, 2 N the
   checkpointed forward again, 2 N the old-log-prob pass; attention 2 x 2 x T^2/2 x q_dim per
   layer forward, 5 such passes) / the device's dense bf16 peak, and the peak memory beside the
   memory plan's figure for the same update (``crl_bench.distributed.memory_plan.learner_rank``).
   FAIL: a non-finite loss or gradient, weights unchanged, a peak above 1.15 x the plan (the plan
   would let a run OOM), MFU below ``--min-mfu`` (CUDA only).
3. ``weight_push``: the learner's weights gathered to bf16 as a push into generation engines
   reads them: on the device (what an NCCL broadcast sends; ``gathered_weights`` order, one
   parameter at a time) and to host memory (what the object-store path copies); times, GB/s,
   and the gathered values equal to the masters cast to bf16 (FAIL otherwise).

At the end one table: a row per section, its status and its figures (``--json`` writes all of
it). ``--smoke`` shrinks every shape so that everything runs on a CPU in about a minute;
``--plant-fail`` makes the learner's check fail on purpose (its plan figure is divided by 100),
to show that a FAIL exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout that is not installed
    sys.path.insert(0, str(ROOT))

QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                 max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=False)
MID = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096,
           tie_word_embeddings=False)
"""~110M parameters: the mixed-precision and FSDP2 checks on a GPU, in seconds."""
SMALL = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=4096, max_position_embeddings=2048,
             tie_word_embeddings=False)
# dense bf16 peak FLOP/s (no sparsity) by device-name substring
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
             "L40S": 362e12, "A10G": 70e12, "L4": 121e12, "4090": 165e12}


def device_info(device: str) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
        return {"device": name, "peak_bf16_flops": peak,
                "memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
    return {"device": "cpu", "peak_bf16_flops": None, "threads": torch.get_num_threads()}


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- 1. fp32 masters under RoleTrainer ---------------------------------------------------------
class RawModelBackend:
    """The trainer's backend interface over a bare transformers model (the check's models are
    random-init from a config: no tokenizer, no model cache). Log-probs as
    ``HFBackend.forward_token_logprobs`` computes them: fp32 logits / temperature, log-softmax at
    the next token, 0 outside the scored positions."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    def trainable_parameters(self, adapter: str | None) -> list[Any]:
        return list(self.model.parameters())

    def after_update(self, adapter: str | None) -> None:
        pass

    def forward_token_logprobs(self, adapter: Any, input_ids: Any, attention_mask: Any, *,
                               temperature: float = 1.0, score_mask: Any = None) -> Any:
        import torch

        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            use_cache=False).logits[:, :-1].float() / temperature
        picked = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)
        valid = attention_mask[:, 1:].bool()
        if score_mask is not None:
            valid = valid & score_mask.to(self.device).bool()
        return torch.where(valid, picked, torch.zeros_like(picked))


def _random_samples(backend: RawModelBackend, vocab: int, n: int, prompt: int, completion: int
                    ) -> list[Any]:
    """``n`` random token sequences with alternating advantages, their old log-probs the
    model's own (the ratio starts at 1)."""
    import torch

    from crl_bench.training.role_trainer import TrainSample

    g = torch.Generator(device="cpu").manual_seed(2)
    ids = torch.randint(0, vocab, (n, prompt + completion), generator=g)
    score = torch.zeros(n, prompt + completion - 1, dtype=torch.bool)
    score[:, prompt - 1:] = True
    with torch.no_grad():
        lp = backend.forward_token_logprobs(None, ids, torch.ones_like(ids), score_mask=score)
    return [TrainSample(ids[i, :prompt].tolist(), ids[i, prompt:].tolist(),
                        lp[i, prompt - 1:].float().cpu().tolist(), 1.0 if i % 2 == 0 else -1.0)
            for i in range(n)]


def master_update(shape: dict[str, Any], device: str, n: int, prompt: int, completion: int
                  ) -> dict[str, Any]:
    import torch

    from crl_bench.config.schema import OptimConfig
    from crl_bench.training.role_trainer import RoleTrainer

    model = build_model(shape, device, torch.bfloat16)
    backend = RawModelBackend(model)
    samples = _random_samples(backend, shape["vocab_size"], n, prompt, completion)
    cfg = OptimConfig(lr=1e-6, weight_decay=0.0, max_grad_norm=1.0, micro_batch_size=2)
    trainer = RoleTrainer(backend, "actor", cfg, total_steps=1)
    stepped = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    before = [p.detach().float().clone() for p in stepped]
    grads: list[Any] = []
    step = trainer.optimizer.step

    def capture(*a: Any, **k: Any) -> Any:  # the (clipped) gradient the optimiser steps with
        grads.append([p.grad.detach().float().clone() for p in stepped])
        return step(*a, **k)

    trainer.optimizer.step = capture
    metrics = trainer.update(samples, loss="ppo_clip", loss_kwargs={"clip_eps": 0.2})
    trainer.optimizer.step = step
    # the reference: one fp32 AdamW step from the same weights with the same gradient
    ref = [torch.nn.Parameter(w.clone()) for w in before]
    for w, gr in zip(ref, grads[0]):
        w.grad = gr.clone()
    torch.optim.AdamW(ref, lr=cfg.lr, weight_decay=cfg.weight_decay).step()
    d_num = d_den = 0.0
    changed = ref_changed = 0
    for b, p, r in zip(before, stepped, ref):
        delta, ref_delta = p.detach().float() - b, r.detach() - b
        d_num += float(((delta - ref_delta) ** 2).sum())
        d_den += float((ref_delta ** 2).sum())
        moved = ref_delta != 0
        ref_changed += int(moved.sum())
        changed += int(((delta != 0) & moved).sum())
    rel_err = (d_num / d_den) ** 0.5 if d_den else float("nan")
    frac = changed / ref_changed if ref_changed else float("nan")
    masters = all(p.dtype == torch.float32 for p in stepped)
    passed = rel_err <= 1e-2 and frac >= 0.99
    return {"params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
            "stepped_dtype": str(stepped[0].dtype).replace("torch.", ""), "fp32_masters": masters,
            "delta_rel_err": round(rel_err, 6), "changed_where_ref_changed": round(frac, 4),
            "loss": round(metrics["loss"], 5), "pass": passed,
            "verdict": "update kept" if passed else
            "FAIL: the bf16 update is not the fp32 one (no fp32 masters?)"}


def build_model(shape: dict[str, Any], device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**shape)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    return model


# -- 2. the sharded learner on one rank ---------------------------------------------------------
SMOKE_SEQ, PAPER_SEQ = 256, 32768
SMOKE_CHUNK, PAPER_CHUNK = 64, 4096


def write_random_model(folder: Path, shape: dict[str, Any]) -> str:
    """A model folder that loads as a random-init Qwen2 of ``shape`` (``config.json`` and the
    ``RANDOM_INIT`` marker, no weights) with a word-level tokenizer of its vocabulary (built
    with ``tokenizers``, transformers' own dependency: no download)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    from crl_bench.llm.models import RANDOM_INIT

    folder.mkdir(parents=True, exist_ok=True)
    Qwen2Config(**shape).save_pretrained(folder)
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, shape["vocab_size"])}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "<pad>")),
                                  pad_token="<pad>", eos_token="<eos>")
    tok.save_pretrained(folder)
    (folder / RANDOM_INIT).write_text(json.dumps({"shape": shape}))
    return str(folder)


def attention_flops(layers: int, q_dim: int, seq: int) -> float:
    """Forward FLOPs of causal self-attention over one sequence of ``seq`` tokens: Q K^T and the
    weighted sum of V, 2 FLOPs per multiply-add, half the square (causal)."""
    return 2 * 2 * layers * q_dim * seq * seq / 2


def learner_update(shape: dict[str, Any], device: str, seq: int, chunk: int, peak: float | None,
                   min_mfu: float, plant_fail: bool, box: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from crl_bench.distributed.fsdp import ShardedLearner
    from crl_bench.distributed.learner import _free_port, join_group
    from crl_bench.distributed.memory_plan import FSDP2_MIXED, learner_rank, shape_from_hf_config
    from crl_bench.config.schema import OptimConfig
    from crl_bench.training.role_trainer import TrainSample

    folder = write_random_model(Path(box["tmp"]) / "model", shape)
    spec = dict(model_name=folder, seed=0, device=device,
                dtype="bfloat16" if device.startswith("cuda") else "float32")
    join_group(spec, 0, 1, ("127.0.0.1", _free_port()))
    box["group"] = True
    cfg = OptimConfig(lr=1e-6, weight_decay=0.0, max_grad_norm=1.0, micro_batch_size=1,
                      micro_batch_tokens=seq, activation_checkpointing=True,
                      logprob_chunk_tokens=chunk, recompute_old_logprobs=True)
    t = time.perf_counter()
    learner = ShardedLearner(spec, "actor", cfg, total_steps=1, seed=0)
    build_s = time.perf_counter() - t
    box["learner"] = learner
    n_params = sum(p.numel() for p in learner.trainer.params)
    prompt = min(2048, seq // 8)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, shape["vocab_size"], (seq,), generator=g).tolist()
    sample = TrainSample(ids[:prompt], ids[prompt:], [0.0] * (seq - prompt), 1.0)
    watched = learner.trainer.params[len(learner.trainer.params) // 2]
    local = watched.to_local() if hasattr(watched, "to_local") else watched
    before = local.detach().float().clone()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    metrics = learner.update([sample], loss="ppo_clip", loss_kwargs={"clip_eps": 0.2},
                             agg="seq-mean-token-mean", temperature=1.0)
    sync(device)
    dt = time.perf_counter() - t
    moved = float((local.detach().float() - before).abs().max())
    cfg_hf = learner.model.config
    q_dim = cfg_hf.num_attention_heads * (getattr(cfg_hf, "head_dim", None)
                                          or cfg_hf.hidden_size // cfg_hf.num_attention_heads)
    flops = 10 * n_params * seq + 5 * attention_flops(cfg_hf.num_hidden_layers, q_dim, seq)
    out: dict[str, Any] = {
        "layers": cfg_hf.num_hidden_layers, "params_b": round(n_params / 1e9, 3),
        "tokens": seq, "build_s": round(build_s, 1), "update_s": round(dt, 2),
        "tokens_per_s": round(seq / dt, 1), "tflops": round(flops / dt / 1e12, 2),
        "loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "max_weight_change": moved,
        "backend": str(dist.get_backend())}
    mfu = flops / dt / peak if peak else None
    out["mfu"] = round(mfu, 4) if mfu is not None else None
    plan = learner_rank(shape_from_hf_config(cfg_hf, "random"), 1, seq, seq - prompt,
                        precision=FSDP2_MIXED, checkpointing=True, logprob_chunk=chunk)["total"]
    if plant_fail:
        plan /= 100
    out["plan_peak_gb"] = round(plan / 1e9, 2)
    fails = []
    if not (torch.isfinite(torch.tensor(metrics["loss"]))
            and torch.isfinite(torch.tensor(metrics["grad_norm"])) and metrics["grad_norm"] > 0):
        fails.append("non-finite loss or zero gradient")
    if moved == 0:
        fails.append("weights unchanged")
    if device.startswith("cuda"):
        peak_mem = torch.cuda.max_memory_allocated()
        out["peak_mem_gb"] = round(peak_mem / 1e9, 2)
        out["peak_over_plan"] = round(peak_mem / plan, 3)
        if peak_mem > 1.15 * plan:
            fails.append(f"peak {peak_mem / 1e9:.1f} GB > 1.15 x plan {plan / 1e9:.1f} GB")
        if mfu is not None and mfu < min_mfu:
            fails.append(f"MFU {mfu:.3f} < {min_mfu}")
    elif plant_fail:
        fails.append(f"planted: plan figure {plan / 1e9:.3f} GB")
    out["pass"] = not fails
    out["verdict"] = "; ".join(fails) if fails else "update ran within the plan"
    return out


# -- 3. gather-and-push of the bf16 weights ------------------------------------------------------
def weight_push(device: str, box: dict[str, Any]) -> dict[str, Any]:
    import torch

    learner = box.get("learner")
    if learner is None:
        raise RuntimeError("the learner section did not build a learner")
    params = learner.trainer.params
    sync(device)
    t = time.perf_counter()
    nbytes, ok = 0, True
    for p in params:  # on the device, one parameter at a time: what an NCCL broadcast sends
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        wire = full.detach().to(torch.bfloat16)
        nbytes += wire.numel() * 2
        del full, wire
    sync(device)
    on_device = time.perf_counter() - t
    t = time.perf_counter()
    host = learner.gathered_weights(dtype=torch.bfloat16)  # the object-store path's host copy
    to_host = time.perf_counter() - t
    for p, h in zip(params[:: max(1, len(params) // 8)], host[:: max(1, len(params) // 8)]):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        ok = ok and torch.equal(full.detach().to(torch.bfloat16).cpu(), h)
    del host
    gb = nbytes / 1e9
    return {"weights_gb": round(gb, 4), "gather_cast_on_device_s": round(on_device, 2),
            "on_device_gb_per_s": round(gb / on_device, 1) if on_device else None,
            "gather_to_host_s": round(to_host, 2),
            "to_host_gb_per_s": round(gb / to_host, 1) if to_host else None,
            "pass": ok, "verdict": "bf16 weights equal the masters" if ok else
            "FAIL: gathered bf16 weights differ from the masters"}


def section(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    t = time.perf_counter()
    try:
        results[name] = {"ok": True, **fn()}
    except Exception as exc:  # one failing part must not hide the others
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                         "trace": traceback.format_exc()[-1500:]}
    results[name]["section_s"] = round(time.perf_counter() - t, 1)
    print(f"[gpu_check] {name}: {'ok' if results[name]['ok'] else 'FAILED'} "
          f"({results[name]['section_s']} s)", flush=True)


def table(results: dict[str, Any]) -> str:
    """One row per section: status (a check's pass/FAIL, else ok/ERROR), seconds, figures."""
    rows = []
    for name, v in results.items():
        if not isinstance(v, dict) or name == "device":
            continue
        status = ("ERROR" if not v.get("ok") else
                  ("pass" if v["pass"] else "FAIL") if "pass" in v else "ok")
        figures = (v.get("error", "")[:160] if not v.get("ok") else ", ".join(
            f"{k}={x}" for k, x in v.items()
            if k not in ("ok", "pass", "section_s", "trace") and not isinstance(x, (dict, list))))
        rows.append(f"{name:<18} {status:<6} {v.get('section_s', ''):>7}  {figures}")
    head = f"{'section':<18} {'status':<6} {'s':>7}  figures"
    return "\n".join([head, "-" * len(head)] + rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", "--small", dest="small", action="store_true",
                    help="tiny shapes, on CPU (the tests run this)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--layers", type=int, default=20,
                    help="decoder layers of the 7B-shaped learner model (default 20 of 28)")
    ap.add_argument("--seq", type=int, default=None, help="tokens of the trajectory (32768)")
    ap.add_argument("--min-mfu", type=float, default=0.2, help="FAIL below this MFU (CUDA)")
    ap.add_argument("--plant-fail", action="store_true",
                    help="make the learner check fail on purpose (tests the exit status)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--json", default=None, help="also write the summary to this file")
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not args.small:
        print("[gpu_check] no GPU: running the smoke shapes on CPU", flush=True)
        args.small = True
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    skip = {s for s in args.skip.split(",") if s}
    info = device_info(device)
    results: dict[str, Any] = {"device": info, "small": args.small}
    t0 = time.perf_counter()
    if "master_update" not in skip:
        n, p, c = (4, 8, 8) if args.small else (8, 128, 128)
        section(results, "master_update",
                lambda: master_update(SMALL if args.small else MID, device, n, p, c))
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    shape = dict(SMALL if args.small else QWEN25_7B)
    if not args.small:
        shape["num_hidden_layers"] = args.layers
    seq = args.seq or (SMOKE_SEQ if args.small else PAPER_SEQ)
    chunk = SMOKE_CHUNK if args.small else PAPER_CHUNK
    shape["max_position_embeddings"] = max(shape["max_position_embeddings"], seq)
    with tempfile.TemporaryDirectory() as tmp:
        box: dict[str, Any] = {"tmp": tmp}
        try:
            if "learner" not in skip:
                section(results, "learner", lambda: learner_update(
                    shape, device, seq, chunk, info.get("peak_bf16_flops"), args.min_mfu,
                    args.plant_fail, box))
            if "weight_push" not in skip:
                section(results, "weight_push", lambda: weight_push(device, box))
        finally:
            box.pop("learner", None)
            if box.get("group"):
                import torch.distributed as dist

                dist.destroy_process_group()
    results["total_s"] = round(time.perf_counter() - t0, 1)
    # decided: every section ran and every check passed
    results["ok"] = all(v.get("ok", True) and v.get("pass", True)
                        for v in results.values() if isinstance(v, dict))
    for v in results.values():
        if isinstance(v, dict):
            v.pop("trace", None) if v.get("ok", True) else None
    print("=" * 30 + " gpu_check summary " + "=" * 30)
    print(f"device: {json.dumps(info)}; total {results['total_s']} s")
    print(table(results))
    print(f"gpu_check: {'PASS' if results['ok'] else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
