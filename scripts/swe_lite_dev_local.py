"""Check every ``lite-dev-local`` task end to end through the env (``crl/SWE-v0``).

For each of the 11 SWE-bench Lite dev instances that rebuild offline:

1. ``reset`` and ``submit`` at once: the base must fail every FAIL_TO_PASS test (and, as the
   recipe verified, pass every PASS_TO_PASS test);
2. ``reset``, replay the gold patch through the env's own ``replace``/``create`` actions, then
   ``submit``: every FAIL_TO_PASS and PASS_TO_PASS test must pass.

The first run builds the shared Python 3.9 venv and downloads the sdists (~250 MB; cached under
``crl_bench.data.cache_dir()/swe/lite-dev-local``). Needs the package index once.

Usage::

    python scripts/swe_lite_dev_local.py [--data-dir ../shared/data/swe] [--only ID ...]
        [--python /path/to/python3.9] [--json results.json]

Exit status 0 when every task behaves as above, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from crl_bench.envs.swe.env import SWETextEnv
from crl_bench.envs.swe.grading import PASSING


def _default_data_dir() -> str | None:
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "swe"
    return str(shared) if shared.is_dir() else None


def check_task(env: SWETextEnv, iid: str) -> dict:
    row: dict = {"instance_id": iid}
    t0 = time.monotonic()
    env.reset(seed=0, options={"task_id": iid})
    row["build_and_reset_s"] = round(time.monotonic() - t0, 2)
    t1 = time.monotonic()
    _obs, _r, _term, _trunc, info = env.step("submit")
    row["base_grade_s"] = round(time.monotonic() - t1, 2)
    base = info["tests"]
    row["base_f2p_failing"] = sum(s not in PASSING for s in base["fail_to_pass"].values())
    row["base_p2p_passing"] = sum(s in PASSING for s in base["pass_to_pass"].values())
    row["n_f2p"], row["n_p2p"] = len(base["fail_to_pass"]), len(base["pass_to_pass"])
    row["base_note"] = base["note"]

    env.reset(seed=0, options={"task_id": iid})
    actions = env.reference_actions()
    row["gold_actions"] = len(actions)
    invalid = []
    t2 = time.monotonic()
    for action in actions:
        obs, _r, _term, _trunc, info = env.step(action)
        if not info["action_valid"]:
            invalid.append(obs[:300])
    row["gold_grade_s"] = round(time.monotonic() - t2, 2)
    gold = info["tests"]
    row["gold_f2p_passing"] = sum(s in PASSING for s in gold["fail_to_pass"].values())
    row["gold_p2p_passing"] = sum(s in PASSING for s in gold["pass_to_pass"].values())
    row["gold_resolved"] = bool(info["success"])
    row["gold_note"] = gold["note"]
    row["invalid_actions"] = invalid
    row["failing_after_gold"] = [t for t, s in {**gold["fail_to_pass"],
                                                **gold["pass_to_pass"]}.items()
                                 if s not in PASSING]
    row["ok"] = (row["base_f2p_failing"] == row["n_f2p"] and row["gold_resolved"]
                 and not invalid)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=_default_data_dir())
    parser.add_argument("--python", default=None, help="a Python 3.9 interpreter")
    parser.add_argument("--only", nargs="*", default=None, help="instance ids to check")
    parser.add_argument("--json", default=None, help="write the per-task rows here")
    parser.add_argument("--isolation", default="auto")
    args = parser.parse_args(argv)

    env = SWETextEnv(task_set="lite-dev-local", data_dir=args.data_dir, python=args.python,
                     isolation=args.isolation)
    ids = args.only or env.task_ids
    rows = []
    start = time.monotonic()
    for iid in ids:
        try:
            row = check_task(env, iid)
        except Exception as exc:  # report and go on with the other tasks
            row = {"instance_id": iid, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        if "error" in row:
            print(f"{iid:<38} ERROR {row['error'][:300]}", flush=True)
            continue
        print(f"{iid:<38} base F2P failing {row['base_f2p_failing']}/{row['n_f2p']}  "
              f"P2P passing {row['base_p2p_passing']}/{row['n_p2p']} | gold F2P "
              f"{row['gold_f2p_passing']}/{row['n_f2p']}  P2P {row['gold_p2p_passing']}/"
              f"{row['n_p2p']}  resolved={row['gold_resolved']}  ({row['gold_actions']} actions;"
              f" reset {row['build_and_reset_s']}s, base grade {row['base_grade_s']}s, gold "
              f"{row['gold_grade_s']}s)  {'OK' if row['ok'] else 'FAIL'}", flush=True)
    sandbox = env.sandbox.describe() if env.sandbox is not None else {}
    env.close()
    n_ok = sum(r["ok"] for r in rows)
    print(f"\n{n_ok}/{len(rows)} tasks OK in {time.monotonic() - start:.0f} s "
          f"(sandbox: {sandbox})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if n_ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
