"""Env-bound episodes/s with 1, 2 and 4 Ray env workers, measured in one run.

ALFWorld (default) or SWE ``mini``, scripted expert actions: each ALFWorld episode resets on a
seed and replays the game's stored walkthrough (``env.unwrapped.walkthrough()``) through
``env.step``; each SWE episode runs a fixed list of tool calls. No model is involved: this is the
env side of a rollout alone. The same ``--envs`` concurrent envs (and the same seeds) are spread
over W workers; every turn, one batched step call per worker, all workers in parallel
(:meth:`~crl_bench.distributed.env_workers.RemoteEnvPool.step_many`, as the Ray rollout does).
Worker start-up and env construction are not timed (one warm-up reset per env first).

    .venv/bin/python benchmarks/scale_envs.py --family alfworld --episodes 48 --envs 8

Prints episodes/s per worker count and the ratios to 1 worker.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

SWE_SCRIPT = ["ls", "cat README.md", "grep -rn def . | head -20", "python -c 'print(1)'",
              "git status", "git diff"]


def episodes_per_s(ray: Any, n_workers: int, env_id: str, kwargs: dict[str, Any], n_envs: int,
                   episodes: int, family: str) -> dict[str, Any]:
    from crl_bench.distributed.env_workers import RemoteEnvPool

    pool = RemoteEnvPool(n_workers, worker_options={"num_cpus": 0.01}, max_restarts=0)
    try:
        envs = pool.make_many(env_id, n_envs, **kwargs)
        pool.reset_many([(e.slot, 10_000 + i, None) for i, e in enumerate(envs)])  # warm-up
        seeds = list(range(episodes))
        steps = 0
        start = time.perf_counter()
        done_eps = 0
        while seeds:
            batch = [(e, seeds.pop(0)) for e in envs[:len(seeds)]] if len(seeds) < n_envs else \
                [(e, seeds.pop(0)) for e in envs]
            pool.reset_many([(e.slot, s, None) for e, s in batch])
            if family == "alfworld":
                scripts = ray.get([pool.workers[pool.slots[e.slot].worker].call.remote(
                    e.slot, "walkthrough") for e, _ in batch])
            else:
                scripts = [list(SWE_SCRIPT) for _ in batch]
            live = {e.slot: list(sc) for (e, _), sc in zip(batch, scripts)}
            while live:
                items = [(slot, cmds.pop(0)) for slot, cmds in live.items()]
                results = pool.step_many(items)
                steps += len(items)
                for (slot, _), res in zip(items, results):
                    obs, _r, term, trunc, _info = res
                    if term or trunc or not live[slot]:
                        del live[slot]
            done_eps += len(batch)
        wall = time.perf_counter() - start
        return {"workers": n_workers, "envs": n_envs, "episodes": done_eps, "steps": steps,
                "wall_s": round(wall, 2), "episodes_per_s": round(done_eps / wall, 3),
                "steps_per_s": round(steps / wall, 1)}
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("alfworld", "swe"), default="alfworld")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--envs", type=int, default=8, help="concurrent envs (all workers together)")
    ap.add_argument("--episodes", type=int, default=32, help="episodes per worker count")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import ray

    env_id, kwargs = (("crl/ALFWorld-v0", {}) if args.family == "alfworld"
                      else ("crl/SWE-v0", {"split": "train"}))
    # address="local": a cluster of its own, never one another process left running
    ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
             log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        rows = [episodes_per_s(ray, int(w), env_id, kwargs, args.envs, args.episodes, args.family)
                for w in args.workers.split(",")]
    finally:
        ray.shutdown()
    base = rows[0]["episodes_per_s"]
    for r in rows:
        r["ratio_vs_first"] = round(r["episodes_per_s"] / base, 2) if base else None
    print(f"{'workers':>8} {'episodes/s':>11} {'steps/s':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['workers']:>8} {r['episodes_per_s']:>11} {r['steps_per_s']:>8} "
              f"{r['ratio_vs_first']:>6}")
    print(json.dumps({"family": args.family, "cpus": os.cpu_count(), "rows": rows}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
