"""One-command GPU check (< 8 min on one H100/H200), one summary at the end.

    python benchmarks/gpu_check.py                 # on a GPU machine
    python benchmarks/gpu_check.py --smoke         # CPU, tiny shapes (the test runs this)

Sections (each timed; a failing section is reported and the others still run):

1. ``tiny_run``: ``crl-bench run --preset tiny`` for one step on the device (``--tasks``,
   default ``swe``: it needs only git, so it runs where NLE / ALFWorld are not installed), i.e.
   the real trainer and HF generation on CUDA; reports the run's metrics record.
2. ``logprob_agreement``: the ``tiny-sft`` model through the HF backend in bf16: sampling
   log-probs recorded by generation vs the same tokens' log-probs recomputed by the training
   forward (``HFBackend.logprobs``), and both vs an fp32 recompute.
3. ``master_update``: the trainer's mixed precision. A random-init Qwen2 model in bf16 trained by
   ``RoleTrainer`` (full fine-tuning, AdamW at lr 1e-6, one update on random token sequences):
   the weights the optimiser steps must move as an fp32 AdamW step from the same weights with
   the same gradient does (relative error of the update <= 1e-2 and >= 99% of the entries that
   the reference changes changed). A trainer that steps the bf16 weights themselves fails it (a
   1e-6 step is below half a bf16 ulp of most weights): the section reports that, it does not
   stop the script.
4. ``fsdp2``: torch FSDP2 at world size 1 (NCCL on CUDA, gloo on CPU): ``fully_shard`` per
   decoder layer and the root with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``,
   one AdamW update on the fp32 sharded parameters; compared with the same update done by hand (a
   bf16 copy computes the gradient, AdamW steps fp32 masters): loss and updated weights.
5. ``update``: a model with Qwen2.5-7B's shape (``Qwen2Config``: 28 layers, hidden 3584, FFN
   18944, 28 heads / 4 KV heads, vocab 152064) built from the config with random weights (no
   download), bf16, full-parameter AdamW: forward + backward + optimiser step on B x T tokens;
   tokens/s and MFU = 6 N tokens/s / peak bf16 FLOP/s (peak from the device name; attention
   FLOPs left out, so MFU is slightly understated).
6. ``generation``: the same model, ``model.generate`` with KV cache, B prompts of P tokens,
   exactly G new tokens each (sampling): generated tokens/s.

The 7B-shaped update holds bf16 weights, bf16 gradients and AdamW's bf16 moments (8 B per
parameter, 61 GB): with fp32 masters (16 B per parameter, 122 GB) the full model leaves no room
for activations on one 141 GB GPU, and the tokens/s of one update step do not depend on where
the optimiser's state lives. On CUDA the section also prints the memory plan's figure for the
same update (``plan_peak_gb``, 1e9 bytes) beside the measured peak (``peak_mem_gb``). The whole
7B shape needs ~100 GB: on an 80 GB GPU run ``--layers 16`` (the MFU of a layer stack is about
independent of its depth; the summary says how many layers ran).

At the end one table: a row per section, its status and its figures (``--json`` writes all of
it). ``--smoke`` (alias ``--small``) shrinks every shape and batch so that everything runs on a
CPU in about a minute (the tiny run takes ~5 min on 2 shared cores: skip it with
``--skip tiny_run``).

On a GPU machine without network (torch, transformers, peft present): install the repo without
dependencies (``pip install --no-deps --no-build-isolation -e .``), bring the missing pure-Python
wheels (gymnasium, farama-notifications, cloudpickle, rich, tqdm) and the small model cache
(``$CRL_BENCH_CACHE/models/tiny-random-*`` and ``tiny-sft-*``: the tiny models and their
tokenizer; set ``CRL_BENCH_CACHE`` to where they are) for sections 1 and 2. Sections 3-6 need
only torch and transformers: their models are random-init from a config, nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


# -- 1. tiny run -------------------------------------------------------------------------------
def tiny_run(device: str, tasks: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "crl_bench.cli", "run", "--agent", "grpo", "--tasks", tasks,
           "--preset", "tiny", "--steps", "1", "--out", str(out), "--no-progress",
           "--set", f"model.device={device}", "--set", "eval.episodes_per_task=1"]
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=str(ROOT), env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"crl-bench run failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout)[-1500:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    keep = {k: v for k, v in last.items() if k.startswith(("charts/success_rate", "losses/actor_loss",
                                                           "losses/actor_grad_norm",
                                                           "timing_s/step", "timing_s/rollout",
                                                           "timing_s/actor_update"))}
    return {"wall_s": round(wall, 1), "steps": last.get("step"), **keep}


# -- 2. log-prob agreement ---------------------------------------------------------------------
def logprob_agreement(device: str, n: int = 8, new_tokens: int = 32) -> dict[str, Any]:
    import torch

    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import SamplingParams

    questions = ["You are in a room with a door to the east. What do you do?",
                 "Find the bug in: def add(a, b): return a - b", "Buy a red shirt under $20.",
                 "Put a clean mug in the coffee machine.", "Which way is north?",
                 "Say hi.", "Describe the room.", "Open the drawer."]
    out: dict[str, Any] = {}
    temp = 0.99
    bf16 = HFBackend("tiny-sft", roles=("actor",), dtype="bfloat16", device=device, seed=0)
    prompts = [bf16.chat_prompt_ids([{"role": "user", "content": questions[i % len(questions)]}])
               for i in range(n)]
    gens = bf16.generate(prompts, SamplingParams(temperature=temp, top_p=0.99,
                                                 max_new_tokens=new_tokens, seed=1))
    sampled = [list(g.logprobs) for g in gens]
    train_bf16 = bf16.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                               "actor", temperature=temp)
    fp32 = HFBackend("tiny-sft", roles=("actor",), dtype="float32", device=device, seed=0)
    # the same LoRA weights in fp32 (the adapters were initialised from the same seed)
    from crl_bench.runner.precision import load_role_weights, role_weights

    load_role_weights(fp32, "actor", [w.float() for w in role_weights(bf16, "actor")])
    train_fp32 = fp32.logprobs([g.prompt_ids for g in gens], [g.completion_ids for g in gens],
                               "actor", temperature=temp)

    def diffs(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
        x = torch.tensor([v for row in a for v in row])
        y = torch.tensor([v for row in b for v in row])
        d = (x - y).abs()
        return {"max_abs": round(float(d.max()), 5), "mean_abs": round(float(d.mean()), 5),
                "ratio_max": round(float((x - y).exp().max()), 4)}

    out["tokens"] = sum(len(s) for s in sampled)
    out["gen_bf16_vs_train_bf16"] = diffs(sampled, train_bf16)
    out["gen_bf16_vs_train_fp32"] = diffs(sampled, train_fp32)
    out["train_bf16_vs_train_fp32"] = diffs(train_bf16, train_fp32)
    return out


# -- 3. fp32 masters under RoleTrainer ---------------------------------------------------------
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

    from crl_bench.runner.trainer import TrainSample

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

    from crl_bench.runner.config import OptimConfig
    from crl_bench.runner.trainer import RoleTrainer

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


# -- 4. FSDP2 at world size 1 ------------------------------------------------------------------
def fsdp2_update(shape: dict[str, Any], device: str, batch: int, seq: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    init = tempfile.NamedTemporaryFile(prefix="gpu_check_pg_", delete=False)
    init.close()
    os.unlink(init.name)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                            init_method=f"file://{init.name}", rank=0, world_size=1)
    try:
        model = build_model(shape, device, torch.float32)
        # the hand-made reference: a copy with bf16 parameters (buffers such as the rotary
        # frequencies stay fp32, as FSDP's policy leaves them) computes the gradient, AdamW steps
        # fp32 masters
        ref_bf16 = build_model(shape, device, torch.float32)
        ref_bf16.load_state_dict(model.state_dict())
        for p in ref_bf16.parameters():
            p.data = p.data.to(torch.bfloat16)
        masters = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        start = [p.detach().clone() for p in model.parameters()]
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        g = torch.Generator(device="cpu").manual_seed(3)
        ids = torch.randint(0, shape["vocab_size"], (batch, seq), generator=g).to(device)

        def loss_of(m: Any) -> Any:
            logits = m(input_ids=ids, use_cache=False).logits[:, :-1].float()
            return -(logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)).mean()

        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
        sync(device)
        t = time.perf_counter()
        loss = loss_of(model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync(device)
        step_s = time.perf_counter() - t
        ref_loss = loss_of(ref_bf16)
        ref_loss.backward()
        for m, p in zip(masters, ref_bf16.parameters()):
            m.grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(masters, 1.0)
        torch.optim.AdamW(masters, lr=1e-6, weight_decay=0.0).step()
        full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
        sharded = all(type(p).__name__ == "DTensor" for p in model.parameters())
        diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(full, masters))
        # entries whose update differs from the reference's by more than a tenth of a step (on
        # CUDA, attention's backward is not bitwise deterministic: Adam's first step, ~lr * sign
        # of the gradient, may flip where a gradient is ~0)
        off = sum(int(((a.detach() - b.detach()).abs() > 1e-7).sum())
                  for a, b in zip(full, masters))
        moved = sum(int((a.detach() != b).sum()) for a, b in zip(full, start))
        total = sum(p.numel() for p in start)
        loss, ref_loss = float(loss.detach()), float(ref_loss.detach())
        ok = sharded and abs(loss - ref_loss) < 1e-3 and off <= 0.01 * total
        return {"sharded_params": sharded, "param_dtype": str(full[0].dtype).replace("torch.", ""),
                "loss": round(loss, 5), "loss_vs_ref": round(abs(loss - ref_loss), 7),
                "max_param_diff_vs_ref": diff,
                "entries_off_ref": round(off / total, 6), "entries_moved": round(moved / total, 4),
                "step_s": round(step_s, 3), "pass": ok}
    finally:
        dist.destroy_process_group()


# -- 5./6. the 7B shape ------------------------------------------------------------------------
def build_model(shape: dict[str, Any], device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**shape)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    return model


def update_throughput(model: Any, device: str, batch: int, seq: int, steps: int,
                      peak: float | None) -> dict[str, Any]:
    import torch

    n_params = sum(p.numel() for p in model.parameters())
    # 6 N FLOPs per token counts the parameters that multiply: not the input embedding (a lookup)
    n_matmul = n_params - model.get_input_embeddings().weight.numel()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)

    def one() -> float:
        out = model(input_ids=ids, use_cache=False)
        logits = out.logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    one()  # warm-up (allocations, kernels, optimiser state)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        one()
    sync(device)
    dt = (time.perf_counter() - t) / steps
    tps = batch * seq / dt
    res = {"params_b": round(n_params / 1e9, 3), "layers": model.config.num_hidden_layers,
           "batch": batch, "seq": seq, "step_s": round(dt, 3), "tokens_per_s": round(tps, 1),
           "model_tflops": round(6 * n_matmul * tps / 1e12, 2)}
    res["mfu"] = round(6 * n_matmul * tps / peak, 3) if peak else None
    if device.startswith("cuda"):
        res["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
        res["plan_peak_gb"] = round(planned_peak(model, batch, seq) / 1e9, 1)
    del opt
    return res


def planned_peak(model: Any, batch: int, seq: int) -> float:
    """The memory plan's bytes for this update (one process, no checkpointing; bf16 weights,
    gradients and AdamW moments: 2 + 2 + 4 B per parameter), to set beside the measured peak."""
    from crl_bench.distributed.memory_plan import Precision, learner_rank, shape_from_hf_config

    bf16_adam = Precision("bf16", weight=2, grad=2, master=0, optimizer=4, compute=2)
    return learner_rank(shape_from_hf_config(model.config), 1, batch * seq, batch * (seq - 1),
                        precision=bf16_adam, checkpointing=False)["total"]


def generation_throughput(model: Any, device: str, batch: int, prompt: int, new: int) -> dict[str, Any]:
    import torch

    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, vocab, (batch, prompt), generator=g).to(device)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=0.99, top_p=0.99,
              use_cache=True, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids[:, :8], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        sync(device)
        t = time.perf_counter()
        out = model.generate(ids, **kw)
        sync(device)
    dt = time.perf_counter() - t
    generated = (out.shape[1] - prompt) * batch
    return {"batch": batch, "prompt": prompt, "new_tokens": new, "wall_s": round(dt, 2),
            "tokens_per_s": round(generated / dt, 1)}


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
                    help="tiny shapes, on CPU (the test runs this)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--tasks", default="swe", help="task set of the tiny run (default swe)")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers of the 7B-shaped model (default: its 28)")
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
    if "tiny_run" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            section(results, "tiny_run", lambda: tiny_run(device, args.tasks, Path(tmp) / "run"))
    if "logprob_agreement" not in skip:
        section(results, "logprob_agreement", lambda: logprob_agreement(device))
    check_shape = SMALL if args.small else MID
    if "master_update" not in skip:
        n, p, c = (4, 8, 8) if args.small else (8, 128, 128)
        section(results, "master_update", lambda: master_update(check_shape, device, n, p, c))
    if "fsdp2" not in skip:
        b, t = (2, 16) if args.small else (4, 512)
        section(results, "fsdp2", lambda: fsdp2_update(check_shape, device, b, t))
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    shape = SMALL if args.small else QWEN25_7B
    if args.layers:
        shape = {**shape, "num_hidden_layers": args.layers}
    model_box: dict[str, Any] = {}
    if not {"update", "generation"} <= skip:
        section(results, "build_model", lambda: (model_box.setdefault(
            "m", build_model(shape, device, torch.bfloat16)), {
                "shape": "small" if args.small else "Qwen2.5-7B",
                "layers": shape["num_hidden_layers"]})[1])
    if "m" in model_box:
        if "update" not in skip:
            b, s, n = (2, 64, 2) if args.small else (4, 1024, 5)
            section(results, "update", lambda: update_throughput(
                model_box["m"], device, b, s, n, info.get("peak_bf16_flops")))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        if "generation" not in skip:
            b, p, g = (4, 16, 8) if args.small else (32, 512, 128)
            section(results, "generation", lambda: generation_throughput(
                model_box["m"], device, b, p, g))
    results["total_s"] = round(time.perf_counter() - t0, 1)
    # ok: every section ran; the checks' own verdicts are in their "pass" and in the table
    results["ok"] = all(v.get("ok", True) for v in results.values() if isinstance(v, dict))
    for v in results.values():
        if isinstance(v, dict):
            v.pop("trace", None) if v.get("ok", True) else None
    print("=" * 30 + " gpu_check summary " + "=" * 30)
    print(f"device: {json.dumps(info)}; total {results['total_s']} s")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
