"""Tables people read, per evaluation: a sample of the evaluated episodes and of the bank's
entries, to TensorBoard (a markdown text summary, ``eval/episodes`` and ``eval/bank``) and to
Weights & Biases (``wandb.Table``s under the same keys). Logging never ends a run: a failure here
is printed once and that logger is left alone."""

from __future__ import annotations

from typing import Any

EPISODE_COLUMNS = ["task", "with_experience", "seed", "success", "score", "actions", "turns",
                   "goal", "actions_taken", "last_completion"]
BANK_COLUMNS = ["id", "family", "title", "content", "retrieved", "used", "mean_outcome"]


def _short(text: Any, n: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[:n - 1] + "…"


def sample_episodes(trajectories: list[Any], n: int = 8) -> list[Any]:
    """Up to ``n`` episodes, the first of each (task, with experience) cell before any second
    one, in play order (the same sample for the same evaluation)."""
    firsts, rest, seen = [], [], set()
    for t in trajectories:
        key = (t.task_name, bool(t.with_experience))
        (rest if key in seen else firsts).append(t)
        seen.add(key)
    return (firsts + rest)[:n]


def episode_rows(trajectories: list[Any], n: int = 8) -> list[list[Any]]:
    rows = []
    for t in sample_episodes(trajectories, n):
        actions = [turn.action for turn in t.turns if turn.action is not None]
        last = t.turns[-1].completion_text if t.turns else ""
        rows.append([t.task_name, bool(t.with_experience), int(t.seed), bool(t.success),
                     round(float(t.score), 3), int(t.n_actions), len(t.turns), _short(t.goal, 160),
                     _short(" | ".join(actions), 200), _short(last, 200)])
    return rows


def bank_rows(manager: Any, n: int = 8) -> list[list[Any]]:
    """The bank's most recently written ``n`` entries (none without a bank)."""
    bank = getattr(manager, "bank", None)
    if bank is None or not hasattr(bank, "list_entries"):
        return []
    return [[e.id, e.family, _short(e.title, 80), _short(e.content, 240), e.times_retrieved,
             e.n_used, None if e.mean_outcome is None else round(float(e.mean_outcome), 3)]
            for e in bank.list_entries(order="recent", limit=n)]


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def log_eval_tables(trainer: Any, step: int, trajectories: list[Any]) -> None:
    """The evaluation's episode and bank tables to ``trainer.tb`` and ``trainer.wandb``."""
    if trainer.tb is None and trainer.wandb is None:
        return
    try:
        episodes = episode_rows(trajectories)
        bank = bank_rows(trainer.ctx.manager) if trainer.ctx.manager is not None else []
    except Exception as exc:  # noqa: BLE001 - logging must never end a run
        print(f"[logs] evaluation tables not written: {type(exc).__name__}: {exc}")
        return
    if trainer.tb is not None:
        try:
            trainer.tb.add_text("eval/episodes", markdown_table(EPISODE_COLUMNS, episodes), step)
            if bank:
                trainer.tb.add_text("eval/bank", markdown_table(BANK_COLUMNS, bank), step)
            trainer.tb.flush()
        except Exception as exc:  # noqa: BLE001
            print(f"[tensorboard] tables stopped: {type(exc).__name__}: {exc}")
    if trainer.wandb is not None:
        try:
            import wandb

            tables = {"eval/episodes": wandb.Table(columns=EPISODE_COLUMNS, data=episodes)}
            if bank:
                tables["eval/bank"] = wandb.Table(columns=BANK_COLUMNS, data=bank)
            trainer.wandb.log(tables, step=step)
        except Exception as exc:  # noqa: BLE001
            print(f"[wandb] tables stopped: {type(exc).__name__}: {exc}")
