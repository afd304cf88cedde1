"""Programmatic entry point: ``run_experiment(...)`` is what ``crl-bench run`` and
``crl-bench reproduce`` call."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any


def default_run_dir(agent: str, tasks: str, seed: int, root: str | Path = "runs") -> Path:
    """``runs/<tasks>__<agent>__<seed>__<time>`` (CleanRL's habit: the name says what ran)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{tasks}__{agent}__{seed}__{stamp}"


def run_experiment(agent: str, tasks: str, preset: str | None, seed: int, out_dir: str | Path,
                   steps: int | None = None, overrides: dict[str, Any] | None = None,
                   resume: bool = True, progress: bool = True) -> Path:
    """Train and evaluate ``agent`` on ``tasks``; returns the run directory.

    With ``resume`` and an existing checkpoint in ``out_dir`` the run continues after the last
    checkpointed step (records of later, unfinished steps are cut first); a finished run is left
    as it is. The configuration of a resumed run is the one stored in ``config.json``; of the
    ``overrides`` only speed settings (``threads``) may change it, others are refused.
    """
    from crl_bench.runner.records import RunDir

    run = RunDir(out_dir)
    run.acquire()  # RunInUseError when another process trains this folder
    try:
        return _run_locked(run, agent=agent, tasks=tasks, preset=preset, seed=seed, steps=steps,
                           overrides=overrides, resume=resume, progress=progress)
    finally:
        run.release()


def _run_locked(run: Any, *, agent: str, tasks: str, preset: str | None, seed: int,
                steps: int | None, overrides: dict[str, Any] | None, resume: bool,
                progress: bool) -> Path:
    from crl_bench.agent import load_agent
    from crl_bench.runner.config import ConfigError, apply_resume_overrides, build_config, config_from_dict
    from crl_bench.runner.loop import Trainer, write_config

    status = run.status()
    if resume and run.config_path.exists():
        if status.get("state") == "done":
            return run.path
        cfg = config_from_dict({k: v for k, v in json.loads(run.config_path.read_text()).items()
                                if k not in ("agent_options", "task_names", "env_ids", "host")})
        if steps is not None:
            cfg.steps = steps
        cfg = apply_resume_overrides(cfg, overrides)
    else:
        if run.config_path.exists() and status.get("state") != "missing":
            raise FileExistsError(f"{run.path} already holds a run ({status.get('state')}); pass "
                                  "--resume to continue it, or choose another --out.")
        cfg = build_config(agent=agent, tasks=tasks, preset=preset, seed=seed, steps=steps,
                           overrides=overrides)
    try:
        agent = load_agent(cfg.agent, cfg.method)
    except ValueError as exc:  # an option the agent does not have, or a bad value
        raise ConfigError(str(exc)) from exc
    trainer = Trainer(cfg, agent, run, progress=progress)
    write_config(run, cfg, agent, trainer.tasks)
    start = 0
    try:
        checkpoint = run.last_checkpoint() if resume else None
        if checkpoint is not None and (checkpoint / "bank.sqlite").is_file():
            from crl_bench.experience.bank import restore_bank

            # entries written after the checkpoint belong to work that is redone now
            restore_bank(checkpoint / "bank.sqlite", run.bank_path)
        trainer.setup()
        if checkpoint is not None:
            start = trainer.load_checkpoint(checkpoint)
            dropped = run.truncate_after(start)
            if any(dropped.values()):
                print(f"[resume] continuing after step {start}; dropped records of unfinished steps: {dropped}")
        else:
            run.truncate_after(-1)  # a crash before the first checkpoint: start clean
        run.set_status("running", start)
        trainer.run_steps(start)
    except BaseException as exc:
        run.set_status("failed", trainer.step, error=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc()[-4000:])
        raise
    finally:
        trainer.close()
    return run.path
