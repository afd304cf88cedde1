"""Is there a credit signal for reading the observation? For the training turns of a MiniHack run
(``learning_minihack.py``'s run directories), split the actions that saw the staircase down into
those taken toward it and the others, and print each kind's mean episode success and mean GRPO
advantage (episode success minus its group's mean: the official mean-only advantage).

    python experiments/minihack_credit.py OUT/runs/MiniHack-Room-Random-5x5-v0__grpo__0
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling experiments


def credit(run: Path) -> dict[str, dict[str, float]]:
    from learning_minihack import GOAL_FEATURE, _tokenizer

    from crl_bench.envs.minihack.actions import normalise_action
    from crl_bench.envs.minihack.scripted import parse_observation

    tok = _tokenizer(json.loads((run / "config.json").read_text())["model"]["actor"])
    kinds: dict[str, list[tuple[float, float]]] = {"toward": [], "other": []}
    for path in sorted((run / "trajectories").glob("train_step_*.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            trajectories = [json.loads(line) for line in fh]
        groups: dict[int, list[dict]] = {}
        for tr in trajectories:
            groups.setdefault(tr["group_id"], []).append(tr)
        for group in groups.values():
            mean = sum(t["success"] for t in group) / len(group)
            for tr in group:
                for t in tr["turns"]:
                    if t["kind"] != "action":
                        continue
                    shown = tok.decode(t["prompt_ids"]).rsplit("Current observation", 1)[-1]
                    shown = shown.split("\n", 1)[-1].split("\n\nAdmissible actions", 1)[0]
                    goal = [g for g in parse_observation(shown).sightings if g.name == GOAL_FEATURE]
                    if goal:
                        toward = goal[0].direction == normalise_action(t["action"])
                        kind = "toward" if toward else "other"
                        kinds[kind].append((float(tr["success"]), tr["success"] - mean))
    return {k: {"turns": len(v), "episode_success": sum(x for x, _ in v) / max(len(v), 1),
                "mean_advantage": sum(a for _, a in v) / max(len(v), 1)} for k, v in kinds.items()}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="a run directory of learning_minihack.py: OUT/runs/<tasks>__<agent>__<seed>")
    args = parser.parse_args()
    for arg in args.runs:
        if not (Path(arg) / "config.json").is_file():
            parser.error(f"{arg} is not a run directory (no config.json): pass "
                         "OUT/runs/<tasks>__<agent>__<seed> of learning_minihack.py's --out OUT")
        for kind, r in credit(Path(arg)).items():
            print(f"{Path(arg).name}: actions {kind if kind == 'toward' else 'not toward'} the stairs: {r['turns']} turns, episode success "
                  f"{r['episode_success']:.3f}, mean advantage {r['mean_advantage']:+.3f}")
