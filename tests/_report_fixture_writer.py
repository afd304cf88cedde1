"""FIXTURE WRITER: writes run directories in the runner's record format, with synthetic numbers.

For the report tests until real ``tiny`` runs can be produced by ``crl_bench.runner.api``. It
follows the run-directory format exactly (config.json, status.json, metrics.jsonl,
episodes.jsonl, eval.jsonl; see ``crl_bench.records.files``), and derives ``eval.jsonl`` from the
eval episodes it writes, the way the runner does. The numbers are random draws (seeded), not
results: the tests recompute every expected value from the files, never from constants.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

BANK_AGENTS = {"static_exp", "exp_only", "comp_rl"}


def _uses_bank(agent: str) -> bool:
    return agent in BANK_AGENTS or agent.startswith("comp_rl_")


def _trains_extractor(agent: str) -> bool:
    return agent in {"exp_only", "comp_rl"} or agent.startswith("comp_rl_")


def _dump(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


def write_fixture_run(run_dir: Path, *, agent: str, tasks: str, task_names: list[str], seed: int,
                      steps: int = 6, eval_every: int = 3, group_size: int = 4,
                      eval_episodes: int = 8, state: str = "done",
                      error: str | None = None) -> Path:
    """Write one synthetic run directory and return it.

    ``state != "done"`` writes a run that stopped half-way (its records end at the step it
    reached), as a crashed or still running run would look.
    """
    rng = random.Random(f"{tasks}/{agent}/{seed}")
    run_dir.mkdir(parents=True, exist_ok=True)
    last_step = steps if state == "done" else max(1, steps // 2)
    config = {"agent": agent, "tasks": tasks, "task_names": list(task_names),
              "preset": "fixture", "seed": seed, "steps": steps,
              "model": "none (report fixture writer)", "group_size": group_size}
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))
    (run_dir / "status.json").write_text(json.dumps(
        {"state": state, "step": last_step, "error": error}))

    skill = {t: rng.uniform(0.1, 0.6) for t in task_names}
    bank = _uses_bank(agent)
    metrics, episodes, evals = [], [], []
    bank_size = 0
    for step in range(1, last_step + 1):
        progress = step / steps
        step_eps = []
        for gi, task in enumerate(task_names):
            for k in range(group_size):
                with_exp = bank and k < group_size // 2
                p = min(0.95, skill[task] + 0.3 * progress + (0.1 if with_exp else 0.0))
                success = rng.random() < p
                n_actions = rng.randint(3, 12) if success else rng.randint(8, 20)
                ep = {"phase": "train", "step": step, "task": task, "env_id": f"crl/{task}-v0",
                      "seed": rng.randrange(10**6), "task_id": f"{task}-{step}-{gi}",
                      "group": gi, "with_experience": with_exp, "success": success,
                      "score": float(success), "reward": float(success),
                      "n_actions": n_actions, "n_turns": n_actions,
                      "tokens": n_actions * 20,
                      "experience_ids": [rng.randrange(100)] if with_exp else []}
                step_eps.append(ep)
        episodes.extend(step_eps)
        rec: dict[str, Any] = {
            "step": step,
            "charts/success_rate": sum(e["success"] for e in step_eps) / len(step_eps),
            "charts/score": sum(e["score"] for e in step_eps) / len(step_eps),
            "charts/avg_actions": sum(e["n_actions"] for e in step_eps) / len(step_eps),
            "losses/actor_pg": rng.gauss(0, 0.05),
            "timing_s/rollout": rng.uniform(1, 2),
        }
        for task in task_names:
            te = [e for e in step_eps if e["task"] == task]
            rec[f"charts/success_rate/{task}"] = sum(e["success"] for e in te) / len(te)
        if bank:
            bank_size += rng.randint(0, 3)
            retrievals = sum(e["with_experience"] for e in step_eps)
            rec.update({"bank/size": bank_size, "bank/retrievals": retrievals,
                        "bank/hit_rate": rng.uniform(0.5, 1.0) if bank_size else 0.0,
                        "timing_s/extractor_wait": rng.uniform(0, 0.2)})
            rec["extractor/reward_mean"] = rng.uniform(-1, 1)
            rec["extractor/malformed_frac"] = rng.uniform(0, 0.3)
        if _trains_extractor(agent):
            rec["losses/extractor_pg"] = rng.gauss(0, 0.05)
        metrics.append(rec)

        if step % eval_every == 0 or step == steps:
            for task in task_names:
                for with_exp in ((True, False) if bank else (False,)):
                    p = min(0.95, skill[task] + 0.3 * progress + (0.1 if with_exp else 0.0))
                    eps = []
                    for i in range(eval_episodes):
                        success = rng.random() < p
                        n_actions = rng.randint(3, 12) if success else rng.randint(8, 20)
                        eps.append({"phase": "eval", "step": step, "task": task,
                                    "env_id": f"crl/{task}-v0", "seed": 1_000_000 + i,
                                    "task_id": f"{task}-eval-{i}", "group": i,
                                    "with_experience": with_exp, "success": success,
                                    "score": float(success), "reward": float(success),
                                    "n_actions": n_actions, "n_turns": n_actions,
                                    "tokens": 20 * n_actions, "experience_ids": []})
                    episodes.extend(eps)
                    evals.append({
                        "step": step, "task": task, "with_experience": with_exp, "n": len(eps),
                        "success_rate": sum(e["success"] for e in eps) / len(eps),
                        "score": sum(e["score"] for e in eps) / len(eps),
                        "avg_actions": sum(e["n_actions"] for e in eps) / len(eps)})
    _dump(run_dir / "metrics.jsonl", metrics)
    _dump(run_dir / "episodes.jsonl", episodes)
    _dump(run_dir / "eval.jsonl", evals)
    return run_dir
