"""What the first command's time is made of: the `quick` preset's prompt tokens per turn and the
CPU seconds of one held-out evaluation, under the current `quick` values and under the earlier
ones (the baseline, measured in the same run).

    .venv/bin/python benchmarks/quick_preset_cost.py --json OUT.json            # both parts
    .venv/bin/python benchmarks/quick_preset_cost.py --tokens-only --generation-split --json OUT.json

Tokens: the chat prompt of the embedded model (tokenizer only), per family of `3mix`, walking
random admissible actions for up to 6 turns on 2 levels, with 1 previous turn shown (earlier) and
none (now). Evaluation: a `grpo` run's step-0 evaluation on `3mix` (2 episodes per task, without
experience: 6 episodes), one torch thread, each setting in a fresh process, timed in CPU seconds
(``time.process_time``) so that a shared machine's load inflates it less than wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAMILIES = {"minihack": "crl/MiniHack-Room-Ultimate-5x5-v0", "webshop": "crl/WebShop-v0",
            "alfworld": "crl/ALFWorld-v0"}
EARLIER = {"rollout.history": 1,
           "rollout.env_max_steps": {"minihack": 8, "webshop": 6, "alfworld": 10, "swe": 6}}


def prompt_tokens(turns: int = 6, levels: int = 2) -> dict:
    import gymnasium as gym

    import crl_bench  # noqa: F401 - registers the envs
    from crl_bench.llm.models import load_tokenizer
    from crl_bench.llm.prompting import HistoryItem, PromptConfig, build_messages

    tok = load_tokenizer("smollm2-135m")
    out: dict = {}
    for history in (1, 0):
        pc = PromptConfig.for_small_model(example_pick="random", history=history)
        for family, env_id in FAMILIES.items():
            env = gym.make(env_id)
            lens = []
            for seed in range(levels):
                obs, info = env.reset(seed=seed)
                past: list[HistoryItem] = []
                rng = random.Random(seed)
                for t in range(turns):
                    msgs = build_messages(pc, family=family, goal=info.get("goal", ""), observation=obs,
                                          history=past, admissible_actions=info.get("admissible_actions"),
                                          turn_index=t, example_seed=seed)
                    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
                    lens.append(len(tok(text)["input_ids"]))
                    action = rng.choice(info.get("admissible_actions") or ["north"])
                    past.append(HistoryItem(observation=obs, response=action))
                    obs, _, terminated, truncated, info = env.step(action)
                    if terminated or truncated:
                        break
            env.close()
            out[f"history={history}/{family}"] = {"turns": len(lens), "mean": sum(lens) / len(lens),
                                                  "max": max(lens)}
    return out


def generation_split(shapes=((6, 300), (12, 300), (6, 150))) -> list[dict]:
    """CPU seconds of one batched generation call (the actor's LoRA adapter, random prompt ids),
    prompt only (1 new token) and with 16 new tokens (no stop): prefill against decoding."""
    import torch

    torch.set_num_threads(1)
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.types import LoraSpec, SamplingParams

    backend = HFBackend("smollm2-135m", roles=("actor", "extractor"), lora=LoraSpec(r=16, alpha=32))
    rng = random.Random(0)
    rows_out = []
    for rows, plen in shapes:
        prompts = [[rng.randrange(1000, 40000) for _ in range(plen)] for _ in range(rows)]
        row: dict = {"rows": rows, "prompt_tokens": plen}
        for new in (1, 16):
            sampling = SamplingParams(temperature=0.99, top_p=0.99, max_new_tokens=new, seed=1)
            t = time.process_time()
            backend.generate(prompts, sampling, "actor")
            row[f"cpu_s_new{new}"] = time.process_time() - t
        rows_out.append(row)
        print(f"generate {rows} rows x {plen} prompt tokens: prefill {row['cpu_s_new1']:.2f} CPU-s, "
              f"+15 decode steps {row['cpu_s_new16'] - row['cpu_s_new1']:.2f} CPU-s", flush=True)
    return rows_out


def evaluation_cost(which: str, out_dir: Path) -> dict:
    """One step-0 evaluation in this process (called in a child per setting)."""
    import torch

    torch.set_num_threads(1)
    from crl_bench.agent import load_agent
    from crl_bench.config.schema import build_config
    from crl_bench.run.loop import RunLoop
    from crl_bench.records.files import RunDir, read_jsonl

    overrides = {"threads": 1, **(EARLIER if which == "earlier" else {})}
    cfg = build_config(agent="grpo", tasks="3mix", preset="quick", overrides=overrides)
    agent = load_agent(cfg.agent, cfg.method)
    t0 = time.process_time()
    trainer = RunLoop(cfg, agent, RunDir(out_dir), progress=False)
    trainer.setup()
    t1, w1 = time.process_time(), time.perf_counter()
    trainer.evaluate(0)
    t2, w2 = time.process_time(), time.perf_counter()
    trainer.close()
    episodes = read_jsonl(out_dir / "episodes.jsonl")
    return {"setting": which, "history": cfg.rollout.history, "env_max_steps": cfg.rollout.env_max_steps,
            "setup_cpu_s": t1 - t0, "eval_cpu_s": t2 - t1, "eval_wall_s": w2 - w1,
            "episodes": len(episodes), "actions": sum(e.get("n_actions", 0) for e in episodes),
            "successes": sum(bool(e.get("success")) for e in episodes)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--tokens-only", action="store_true", help="skip the evaluations (seconds, not minutes)")
    p.add_argument("--generation-split", action="store_true",
                   help="also time prefill against decoding of one generation call (~1 CPU-min)")
    p.add_argument("--child", nargs=2, metavar=("SETTING", "DIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(evaluation_cost(args.child[0], Path(args.child[1]))))
        return
    result: dict = {"command": " ".join(["python"] + sys.argv), "prompt_tokens": prompt_tokens()}
    for key, row in result["prompt_tokens"].items():
        print(f"prompt tokens {key:22s} mean {row['mean']:.0f}  max {row['max']}", flush=True)
    if args.generation_split:
        result["generation_split"] = generation_split()
    if not args.tokens_only:
        evals = {}
        for which in ("earlier", "now"):
            with tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run([sys.executable, __file__, "--child", which, str(Path(tmp) / "run")],
                                      capture_output=True, text=True, check=True)
            evals[which] = json.loads(proc.stdout.strip().splitlines()[-1])
            e = evals[which]
            print(f"evaluation ({which}): {e['episodes']} episodes, {e['actions']} actions, "
                  f"{e['eval_cpu_s']:.1f} CPU-s ({e['eval_wall_s']:.1f} s wall)", flush=True)
        ratio = evals["earlier"]["eval_cpu_s"] / evals["now"]["eval_cpu_s"]
        result.update(evaluation=evals, ratio_earlier_vs_now=ratio)
        print(f"evaluation CPU-s, earlier / now: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
