"""The training loop: for each step, the agent's step; evaluate; log; checkpoint.

What a step *does* is the agent's (``baselines/``, see :mod:`crl_bench.agent`); the parts it uses
are built once by the :class:`~crl_bench.run.context.RunContext`. This module only drives:

1. evaluate at step 0 (held-out tasks, with and without experience for agents with a bank);
2. for step = 1..N: ``agent.train_step(ctx, step)``; record its episodes and trajectories;
   at the last step wait for the extractor track to drain; evaluate every ``eval.every`` steps
   and at the end; write the step's metrics; checkpoint (adapters, optimisers, RNG, the bank
   and the extractor track's state).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from crl_bench.agent import Agent
from crl_bench.config.schema import RunConfig
from crl_bench.run.context import RunContext
from crl_bench.run.eval_logs import log_eval_tables
from crl_bench.memory import limit_malloc_arenas, peak_rss_gb, release_free_memory, rss_gb
from crl_bench.records.files import RunDir, write_json_atomic
from crl_bench.training.role_trainer import timed

AGENT_STATE_KEY = "__agent__"
"""The key of the agent's own state (:meth:`crl_bench.agent.Agent.state_dict`) in a checkpoint's
``state.pt``, beside each part's (no part has this name)."""


MOMENTS = ("startup", "steps", "episodes", "checkpoint")
HOOKS: list[Callable[[str, "int | None", "RunLoop"], None]] = []
"""Observers of a run's moments, called as ``hook(moment, step, trainer)``: ``startup`` (models,
bank and config ready, nothing recorded), ``steps`` (this process's first step is about to
start), ``episodes`` (a step's episodes and trajectories written, its metrics not) and
``checkpoint`` (inside the checkpoint write: the temporary folder holds the adapters, trainers,
RNG and bank, not the loop state). Empty unless a caller installs one; the resume tests install
a fault injector here (tests/_faults.py)."""


def episode_record(traj: Any, phase: str, step: int) -> dict[str, Any]:
    record = _episode_record(traj, phase, step)
    if "tampered" in (traj.meta or {}):  # graded episodes only (SWE): other records unchanged
        record["tampered"] = bool(traj.meta["tampered"])
    return record


def tampered_count(trajs: list[Any]) -> int | None:
    """Graded episodes whose grading found the tests tampered with; None when none was graded
    (the metric is then left out)."""
    graded = [t for t in trajs if "tampered" in (t.meta or {})]
    return sum(bool(t.meta["tampered"]) for t in graded) if graded else None


def _episode_record(traj: Any, phase: str, step: int) -> dict[str, Any]:
    return {"phase": phase, "step": step, "task": traj.task_name, "env_id": traj.env_id,
            "seed": traj.seed, "task_id": traj.task_id, "group": traj.group_id,
            "with_experience": traj.with_experience, "success": bool(traj.success),
            "score": float(traj.score), "reward": float(traj.reward), "n_actions": traj.n_actions,
            "n_turns": len(traj.turns), "n_invalid_format": traj.n_invalid_format,
            "n_tool_calls": traj.n_tool_calls, "tokens": traj.tokens,
            "experience_ids": list(traj.experience_ids), "wall_s": round(traj.wall_s, 3),
            "error": traj.error,  # the env raised: the episode ended there (rollout.py)
            "actions": [t.action for t in traj.turns if t.action is not None]}  # sent to the env


def combine_extractor_batches(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """The step record's view of the extractor batches that finished since the last step.

    The track runs behind the actor loop, so a step may see none, one or several batches.
    Durations (keys ending in ``_s``) are summed, so a run's records add up to the time the
    extractor spent; other values are the last batch's; ``extractor/batches_done`` says how many
    were combined. Every batch's own record also goes to ``extractor.jsonl`` (``step``: the actor
    step that recorded it, ``batch_step``: the step whose episodes it distilled).
    """
    out: dict[str, Any] = {}
    for m in batches:
        for k, v in m.items():
            if k == "step":
                continue
            summed = k.endswith("_s") and k in out and isinstance(v, (int, float)) and not isinstance(v, bool)
            out[k] = out[k] + v if summed else v
    out["extractor/batches_done"] = len(batches)
    return out


class RunLoop:
    """Runs ``agent`` for ``cfg.steps`` steps in ``run_dir``. See the module docstring.

    ``context``: builds the run's parts, ``context(cfg, run_dir)`` (default: :class:`RunContext`,
    one process; :func:`crl_bench.distributed.context.ray_context` spreads them over Ray)."""

    def __init__(self, cfg: RunConfig, agent: Agent, run_dir: RunDir, *, progress: bool = True,
                 context: Callable[[RunConfig, RunDir], RunContext] = RunContext) -> None:
        self.cfg = cfg
        self.agent = agent
        self.run = run_dir
        self.progress = progress
        self.ctx = context(cfg, run_dir)
        self.tasks = self.ctx.tasks
        self.tb: Any = None
        self.wandb: Any = None
        self._bank_counters = (0.0, 0.0)  # (queries, empty results) at the last step

    @property
    def step(self) -> int:
        return self.ctx.step

    def reached(self, moment: str, step: int | None = None) -> None:
        """Tell the installed :data:`HOOKS` that the run is at ``moment`` (one of :data:`MOMENTS`)."""
        for hook in HOOKS:
            hook(moment, step, self)

    def setup(self) -> None:
        from crl_bench.run.progress import NullProgress, ProgressReporter

        # the live line starts before the models load (that alone can take a minute)
        self.ctx.progress = (ProgressReporter().start() if self.progress else NullProgress())
        self.ctx.progress.set_phase("loading models")
        self.ctx.seed_everything()
        limit_malloc_arenas(2)
        self.ctx.check_tasks()
        self.agent.build(self.ctx)
        self.wandb = _start_wandb(self.cfg, self.run)
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run.path / "tensorboard"))
        except Exception:  # tensorboard is optional
            self.tb = None

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, Any]:
        ctx = self.ctx
        modes = [False] + ([True] if ctx.manager is not None else [])
        if ctx.manager is not None and ctx.cfg.eval.modes == "with_experience":
            modes = [True]  # official: eval_memory_split off, every episode with memory
        records, summaries, played = [], [], []
        out: dict[str, Any] = {}
        for with_exp in modes:
            trajs = ctx.play("eval", step, ctx.eval_plan(with_exp))
            played.extend(trajs)
            records.extend(episode_record(t, "eval", step) for t in trajs)
            for task in self.tasks:
                mine = [t for t in trajs if t.task_name == task.name]
                n = len(mine)
                summaries.append({"step": step, "task": task.name, "with_experience": with_exp, "n": n,
                                  "success_rate": sum(t.success for t in mine) / max(1, n),
                                  "score": sum(t.score for t in mine) / max(1, n),
                                  "avg_actions": sum(t.n_actions for t in mine) / max(1, n)})
            tag = "with_exp" if with_exp else "without_exp"
            out[f"eval/success_rate_{tag}"] = sum(t.success for t in trajs) / max(1, len(trajs))
            out[f"eval/avg_actions_{tag}"] = sum(t.n_actions for t in trajs) / max(1, len(trajs))
            tampered = tampered_count(trajs)
            if tampered is not None:
                out[f"eval/swe_tampered_{tag}"] = tampered
        self.run.append("episodes.jsonl", records)
        self.run.append("eval.jsonl", summaries)
        # in episodes.jsonl's order (`crl-bench show RUN_DIR --episode N` pairs them)
        self.run.write_trajectories(step, "eval", [t.to_json() for t in played])
        log_eval_tables(self, step, played)  # sampled episodes and bank entries: TB and W&B
        return out

    # -- the loop ------------------------------------------------------------------------------
    def run_steps(self, start_step: int) -> None:
        cfg, ctx = self.cfg, self.ctx
        progress = ctx.progress
        self.reached("steps", start_step + 1)
        eval_steps = [s for s in range(start_step + 1, cfg.steps + 1)
                      if s == cfg.steps or (cfg.eval.every and s % cfg.eval.every == 0)]
        if start_step == 0 and cfg.eval.at_start:
            eval_steps.insert(0, 0)
        modes = 2 if ctx.manager is not None else 1
        progress.plan_run(total_steps=cfg.steps, start_step=start_step,
                          train_episodes_per_step=cfg.rollout.groups * cfg.rollout.group_size,
                          eval_episodes=modes * cfg.eval.episodes_per_task * len(self.tasks),
                          eval_steps=eval_steps)
        if start_step == 0 and cfg.eval.at_start:
            m: dict[str, Any] = {}
            with timed(m, "timing_s/eval"):
                m.update(self.evaluate(0))
            ctx.timings.clear()
            self._write_metrics(0, m)
        for step in range(start_step + 1, cfg.steps + 1):
            ctx.step = step
            progress.step_started(step)
            progress.set_phase("playing", step)
            t_step = time.perf_counter()
            metrics: dict[str, Any] = {}
            ctx.take_extractor_wait()
            with timed(metrics, "timing_s/train_step"):
                result = self.agent.train_step(ctx, step)
            metrics.update(result.metrics)
            metrics.update(ctx.timings)
            ctx.timings.clear()
            trajs = result.trajectories
            self.run.append("episodes.jsonl", [episode_record(t, "train", step) for t in trajs])
            self.run.write_trajectories(step, "train", [t.to_json() for t in trajs])
            self.reached("episodes", step)
            if ctx.extractor is not None and step == cfg.steps:
                # the last batches (and a due merge) land in this record
                progress.set_phase("extracting (final drain)")
                with timed(metrics, "timing_s/final_drain"):
                    ctx.extractor.wait_idle()
            self._step_metrics(step, trajs, metrics)
            progress.step_done(step)
            if step == cfg.steps or (cfg.eval.every and step % cfg.eval.every == 0):
                with timed(metrics, "timing_s/eval"):
                    metrics.update(self.evaluate(step))
                ctx.timings.clear()
            release_free_memory()
            metrics["memory/rss_gb"] = rss_gb()
            metrics["memory/peak_rss_gb"] = peak_rss_gb()  # since the process started
            metrics["timing_s/extractor_wait"] = ctx.take_extractor_wait()
            metrics["timing_s/step"] = time.perf_counter() - t_step
            metrics["timing_s/extractor_wait_frac"] = (metrics["timing_s/extractor_wait"]
                                                       / metrics["timing_s/step"])
            self._write_metrics(step, metrics)
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                self.save_checkpoint(step)
            self.run.set_status("running" if step < cfg.steps else "done", step)
            extra = f"train success {metrics.get('charts/success_rate', 0):.2f}"
            if "bank/size" in metrics:
                extra += f", bank {metrics['bank/size']}"
            progress.extra = extra
        progress.set_phase("done")

    def _step_metrics(self, step: int, trajs: list[Any], metrics: dict[str, Any]) -> None:
        ctx = self.ctx
        n = max(1, len(trajs))
        metrics["charts/success_rate"] = sum(t.success for t in trajs) / n
        metrics["charts/score"] = sum(t.score for t in trajs) / n
        metrics["charts/avg_actions"] = sum(t.n_actions for t in trajs) / n
        metrics["charts/invalid_format_frac"] = (sum(t.n_invalid_format for t in trajs)
                                                 / max(1, sum(len(t.turns) for t in trajs)))
        metrics["charts/tokens"] = sum(t.tokens for t in trajs)
        metrics["charts/env_errors"] = sum(1 for t in trajs if t.error)  # env raised: episode ended
        tampered = tampered_count(trajs)
        if tampered is not None:  # graded (SWE) episodes this step that hooked the tests
            metrics["charts/swe_tampered"] = tampered
        for flag, tag in ((True, "with_exp"), (False, "without_exp")):
            sub = [t for t in trajs if t.with_experience == flag]
            if sub:
                metrics[f"charts/success_rate_{tag}"] = sum(t.success for t in sub) / len(sub)
        for task in {t.task_name for t in trajs}:
            sub = [t for t in trajs if t.task_name == task]
            metrics[f"charts/success_rate/{task}"] = sum(t.success for t in sub) / len(sub)
        if ctx.manager is not None:
            stats = ctx.manager.stats()
            metrics.update({(k if k.startswith("bank/") else f"bank/{k}"): v
                            for k, v in stats.items() if isinstance(v, (int, float))})
            # per-step figures from the manager's running counters (they restart with the process)
            queries, empty = stats["bank/queries"], stats["bank/empty_results"]
            prev_q, prev_e = self._bank_counters
            metrics["bank/retrievals"] = queries - prev_q
            if queries > prev_q:
                metrics["bank/hit_rate"] = 1.0 - (empty - prev_e) / (queries - prev_q)
            self._bank_counters = (queries, empty)
        if ctx.extractor is not None:
            metrics["extractor/backlog"] = ctx.extractor.backlog
            metrics.update({f"extractor/{k}": v for k, v in ctx.extractor.stats.items()})
            batches = ctx.take_extractor_metrics()  # batches finished since the last step
            metrics.update(combine_extractor_batches(batches))
            if batches:  # each batch's own record, nothing merged away (see the function)
                self.run.append("extractor.jsonl", [
                    {"step": step, "batch_step": m.get("step"),
                     **{k: v for k, v in m.items() if k != "step"}} for m in batches])

    def _write_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.append("metrics.jsonl", [{"step": step, "time": time.time(), **metrics}])
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            try:
                self.wandb.log({k: v for k, v in metrics.items()
                                if isinstance(v, (int, float)) and not isinstance(v, bool)}, step=step)
            except Exception as exc:  # noqa: BLE001 - logging must never end a run
                print(f"[wandb] logging stopped: {type(exc).__name__}: {exc}")
                self.wandb = None

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        """Each part's state (``state.pt``, keyed by part) and files (adapters, the bank) into a
        new checkpoint folder, under the model lock so that weights and optimiser states agree;
        then the loop's own state (``loop_state.json``)."""
        import torch

        ctx = self.ctx
        for part in ctx.parts:
            part.before_checkpoint()
        tmp = self.run.new_checkpoint_tmp()
        with ctx.lock:
            states = {part.name: part.state_dict(tmp) for part in ctx.parts}
            states[AGENT_STATE_KEY] = self.agent.state_dict()  # the agent's own state
        torch.save(states, tmp / "state.pt")
        self.reached("checkpoint", step)
        from crl_bench.records.checksums import checkpoint_fingerprint

        # the run's fingerprint too: under the checkpoint's checksums, a resume compares
        # config.json with it even when fingerprint.json is deleted
        state = {"step": step, "bank_counters": list(self._bank_counters),
                 "fingerprint": checkpoint_fingerprint(self.cfg)}
        (tmp / "loop_state.json").write_text(json.dumps(state))
        self.run.commit_checkpoint(tmp)

    def load_checkpoint(self, path: Path) -> int:
        import torch

        states = torch.load(path / "state.pt", weights_only=False)
        for part in self.ctx.parts:
            part.load_state_dict(states.get(part.name, {}), path)
        self.agent.load_state_dict(states.get(AGENT_STATE_KEY, {}))
        state = json.loads((path / "loop_state.json").read_text())
        if state.get("bank_counters") is not None:  # (queries, empty results) at the last step
            queries, empty = state["bank_counters"]
            self._bank_counters = (float(queries), float(empty))
        return int(state["step"])

    def close(self) -> None:
        self.ctx.progress.close()
        self.ctx.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            try:
                self.wandb.finish()
            except Exception:  # noqa: BLE001
                pass
            self.wandb = None


def wandb_wanted() -> bool:
    """Weights & Biases logging is on when ``wandb`` is installed and asked for: ``--wandb``
    (sets ``CRL_WANDB=1``), or ``WANDB_MODE`` / ``WANDB_API_KEY`` set; ``CRL_WANDB=0`` turns it
    off. Installed alone is not enough, so that an installed wandb never prompts or waits on
    the network in tests and scripts."""
    flag = os.environ.get("CRL_WANDB")
    if flag is not None:
        return flag not in ("0", "", "false")
    return bool(os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"))


def _start_wandb(cfg: RunConfig, run: RunDir) -> Any:
    """A wandb run beside TensorBoard (files under ``RUN_DIR/wandb``), or None. Without an API
    key and without ``WANDB_MODE`` it runs offline (``wandb sync RUN_DIR/wandb/offline-run-*``
    uploads it later)."""
    if not wandb_wanted():
        return None
    try:
        import wandb
    except ImportError:
        print("[wandb] asked for but not installed: pip install 'crl-bench[wandb]'; logging to "
              "TensorBoard only.")
        return None
    mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    try:
        # the seeds of one configuration share a group (W&B's grouped runs: mean and spread)
        group = os.environ.get("WANDB_RUN_GROUP") or f"{cfg.tasks}__{cfg.agent}__{cfg.preset}"
        return wandb.init(project=os.environ.get("WANDB_PROJECT", "crl-bench"), name=run.path.name,
                          group=group, dir=str(run.path), config=cfg.to_dict(), mode=mode,
                          tags=[cfg.agent, cfg.tasks, cfg.preset], reinit=True)
    except Exception as exc:  # noqa: BLE001 - logging must never stop a run
        print(f"[wandb] could not start ({type(exc).__name__}: {exc}); logging to TensorBoard only.")
        return None


def write_config(run: RunDir, cfg: RunConfig, agent: Agent, tasks: tuple[Any, ...]) -> None:
    import platform

    data = cfg.to_dict()
    data["agent_options"] = agent.options()
    data["task_names"] = [t.name for t in tasks]
    data["env_ids"] = [t.env_id for t in tasks]
    data["host"] = {"python": platform.python_version(), "machine": platform.machine()}
    write_json_atomic(run.config_path, data)
