"""``crl-bench show RUN_DIR --episode N``: one episode as the model saw it.

Episode N is line N (from 0) of ``RUN_DIR/episodes.jsonl`` (training and evaluation episodes, in
the order they were recorded; ``crl-bench show RUN_DIR`` lists them). Its full trajectory is in
``trajectories/<phase>_step_<step>.jsonl.gz``, at the same position among that step's episodes
of that phase. Each turn's prompt is decoded from the very token ids the model was given (with
the chat template's special tokens), then comes what it wrote, the action the env received and
what came back. In a whole-conversation run (``rollout.conversation: full``) a turn's prompt
extends the previous one; only the new part is printed.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Callable


class ShowError(ValueError):
    """The run directory or the episode asked for is not there; the message says what is."""


def _records(run: Path) -> list[dict[str, Any]]:
    from crl_bench.records.files import read_jsonl

    if not (run / "episodes.jsonl").is_file():
        raise ShowError(f"{run} holds no episodes.jsonl: give a run directory (or one seed's "
                        "folder of an evaluation, e.g. evals/NAME/seed_0)")
    return read_jsonl(run / "episodes.jsonl")


def episode_index_lines(run: Path, limit: int = 50) -> list[str]:
    """The episodes of a run, one line each, for picking N."""
    records = _records(run)
    lines = [f"{len(records)} episode(s) in {run / 'episodes.jsonl'}; show one with "
             f"--episode N:", f"  {'N':>5}  {'phase':<5} {'step':>4}  {'task':<22} exp  success  "
             "actions"]
    for i, r in enumerate(records[:limit]):
        lines.append(f"  {i:>5}  {r.get('phase', ''):<5} {r.get('step', 0):>4}  "
                     f"{str(r.get('task', ''))[:22]:<22} {'yes' if r.get('with_experience') else 'no ':<3}  "
                     f"{str(bool(r.get('success'))):<7}  {r.get('n_actions', '')}")
    if len(records) > limit:
        lines.append(f"  ... {len(records) - limit} more (--episode N shows any of them)")
    return lines


def find_trajectory(run: Path, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Episode ``index``'s record and its stored trajectory."""
    records = _records(run)
    if not 0 <= index < len(records):
        raise ShowError(f"--episode {index}: {run} has episodes 0..{len(records) - 1} "
                        f"(`crl-bench show {run}` lists them)")
    rec = records[index]
    phase, step = rec.get("phase"), int(rec.get("step", 0))
    position = sum(1 for r in records[:index]
                   if r.get("phase") == phase and int(r.get("step", 0)) == step)
    path = run / "trajectories" / f"{phase}_step_{step:05d}.jsonl.gz"
    if not path.is_file():
        raise ShowError(f"episode {index} ({phase}, step {step}) has no stored trajectory: "
                        f"{path} does not exist (runs before evaluation trajectories were kept "
                        "store training episodes only)")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for k, line in enumerate(fh):
            if k == position:
                traj = json.loads(line)
                break
        else:
            raise ShowError(f"{path} holds fewer episodes than episodes.jsonl says ({position + 1} "
                            "expected); the records are damaged")
    if (traj.get("task_name"), int(traj.get("seed", -1))) != (rec.get("task"), int(rec.get("seed", -2))):
        raise ShowError(f"{path}, episode {position}: task {traj.get('task_name')} seed "
                        f"{traj.get('seed')} does not match episodes.jsonl line {index} "
                        f"({rec.get('task')} seed {rec.get('seed')}); the records are damaged")
    return rec, traj


def run_decoder(run: Path) -> Callable[[list[int]], str]:
    """Token ids -> text with the run's actor tokenizer (special tokens kept)."""
    cfg = json.loads((run / "config.json").read_text())
    if (cfg.get("evaluated") or {}).get("source") == "endpoint":
        from crl_bench.llm.openai_backend import ChatMLByteTokenizer

        tok: Any = ChatMLByteTokenizer()
    else:
        from crl_bench.llm.models import load_tokenizer

        tok = load_tokenizer(cfg["model"]["actor"])
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def format_episode(run: Path, index: int, decode: Callable[[list[int]], str] | None = None
                   ) -> list[str]:
    rec, traj = find_trajectory(run, index)
    decode = decode or run_decoder(run)
    source = (json.loads((run / "config.json").read_text()).get("evaluated") or {}).get("source")
    unit = "bytes" if source == "endpoint" else "tokens"  # an endpoint's ids are UTF-8 bytes
    head = (f"episode {index}: {rec.get('phase')} step {rec.get('step')}, {traj['task_name']} "
            f"({traj['env_id']}), task {traj.get('task_id') or '-'}, seed {traj['seed']}, "
            f"{'with' if traj['with_experience'] else 'without'} experience")
    lines = [head, f"goal: {traj.get('goal', '')}"]
    if traj.get("experience_text"):
        lines.append(f"experience given: {traj['experience_ids']}")
    previous: list[int] = []
    for k, turn in enumerate(traj["turns"]):
        prompt = list(turn["prompt_ids"])
        if previous and prompt[:len(previous)] == previous:
            shown, note = prompt[len(previous):], " (continues the conversation: new part only)"
        else:
            shown, note = prompt, ""
        lines += ["", f"===== turn {k}: prompt, {len(prompt)} {unit}{note} =====", decode(shown),
                  f"===== turn {k}: the model wrote ({len(turn['completion_ids'])} {unit}, "
                  f"{turn.get('finish_reason') or '-'}) =====", turn["completion_text"]]
        if turn.get("kind") == "action":
            lines.append(f"----- action sent: {turn.get('action')!r}; reward {turn['reward']:+.2f}")
        elif turn.get("kind") == "ask":
            lines.append(f"----- asked the bank: {turn.get('tool_query')!r}")
        else:
            lines.append(f"----- invalid format; reward {turn['reward']:+.2f}")
        lines.append(f"----- came back: {turn['observation']}")
        previous = prompt + list(turn["completion_ids"])
    end = (traj.get("meta") or {}).get("end_reason", "")
    lines += ["", f"===== end: success={traj['success']} score={traj['score']:.2f} "
                  f"actions={traj['n_actions']} turns={len(traj['turns'])}"
              + (f" ({end})" if end else "") + (f" error: {traj['error']}" if traj.get("error") else "")]
    return lines
