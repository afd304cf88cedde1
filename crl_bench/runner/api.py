"""Programmatic entry point: ``run_experiment(...)`` is what ``crl-bench run`` and
``crl-bench reproduce`` call."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def default_run_dir(agent: str, tasks: str, seed: int, root: str | Path = "runs") -> Path:
    """``runs/<tasks>__<agent>__<seed>__<time>`` (CleanRL's habit: the name says what ran)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{tasks}__{agent}__{seed}__{stamp}"


def run_experiment(agent: str | None, tasks: str | None, preset: str | None, seed: int | None,
                   out_dir: str | Path, steps: int | None = None,
                   overrides: dict[str, Any] | None = None, resume: bool = True,
                   progress: bool = True, repair: bool = False,
                   ray: dict[str, Any] | None = None) -> Path:
    """Train and evaluate ``agent`` on ``tasks``; returns the run directory.

    ``ray``: run on a Ray cluster (``{"address": None or "HOST:PORT", "plan": "cpu"}``, the
    keyword arguments of :func:`crl_bench.distributed.context.ray_context`); None: one process.

    With ``resume`` and an existing checkpoint in ``out_dir`` the run continues after the last
    checkpointed step (records of later, unfinished steps are cut first); a finished run is left
    as it is, unless ``steps`` is larger than its own: then it goes on from its last step (the
    evaluation of that step stays in its records, so the curve gets one more point). The
    configuration of a resumed run is the one stored in ``config.json``: ``agent``, ``tasks``,
    ``seed`` and ``preset`` may be None (taken from it) or must agree with it; of the
    ``overrides`` only speed settings (``threads``) may change it, others are refused. ``steps``
    may extend a resumed run, but not end it before its last checkpoint.

    A damaged record line stops a resume with the file and line named; ``repair=True`` moves such
    lines aside to ``<file>.bad`` and goes on. A checkpoint whose step is the run's last marks the
    run done (the crash came after its last checkpoint).

    ``None`` for ``agent`` / ``tasks`` / ``seed`` of a new run means comp_rl / 3mix / 0.
    """
    from crl_bench.records.files import RunDir

    if repair and not resume:
        raise ValueError("--repair only applies to --resume (it repairs the records of the run "
                         "being continued).")
    new = None
    if not (resume and (Path(out_dir) / "config.json").is_file()):
        # a new run's configuration is checked before OUT is touched: refused, it leaves nothing
        new = _new_run_config(agent, tasks, preset, seed, steps, overrides)
    run = RunDir(out_dir)
    run.acquire()  # RunInUseError when another process trains this folder
    try:
        run.remove_stale_temporaries()  # left by a killed process; we hold the run now
        return _run_locked(run, agent=agent, tasks=tasks, preset=preset, seed=seed, steps=steps,
                           overrides=overrides, resume=resume, progress=progress, repair=repair,
                           ray=ray, new=new)
    finally:
        run.release()


def _new_run_config(agent: str | None, tasks: str | None, preset: str | None, seed: int | None,
                    steps: int | None, overrides: dict[str, Any] | None) -> tuple[Any, Any]:
    """A new run's configuration and agent, every check done (the device included); nothing
    is built or written."""
    from crl_bench.config.schema import build_config

    cfg = build_config(agent=agent, tasks=tasks, preset=preset,
                       seed=0 if seed is None else seed, steps=steps, overrides=overrides)
    return cfg, _checked_agent(cfg)


def _checked_agent(cfg: Any) -> Any:
    """The run's agent (a plugin is imported now, with its --set method.* options) and the check
    of this machine's devices, before anything is built (``cfg`` is validated already)."""
    from crl_bench.agent import load_agent
    from crl_bench.config.schema import ConfigError
    from crl_bench.config.validation import check_device_usable

    try:
        agent_obj = load_agent(cfg.agent, cfg.method)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    check_device_usable(cfg.model.device)  # before a model is loaded onto it
    return agent_obj


def require_stored_run(out_dir: str | Path, given: dict[str, Any]) -> None:
    """``--resume`` continues a run that exists: a folder without ``config.json`` (never
    started, or stopped before it wrote its configuration) is refused, never silently started
    as some other experiment. ``given``: the options the command had, for the fix it names."""
    from crl_bench.config.schema import ConfigError

    path = Path(out_dir)
    if (path / "config.json").is_file():
        return
    what = ("does not exist" if not path.exists() else
            "holds no config.json (the run was stopped before it wrote its configuration, so "
            "there is nothing to continue)")
    placeholder = {"--agent": "AGENT", "--tasks": "TASKS", "--preset": "PRESET"}
    options = [f"{k} {v}" for k, v in given.items() if v is not None]
    options += [f"{k} {v}" for k, v in placeholder.items() if given.get(k) is None]
    raise ConfigError(f"--resume: {path} {what}. Start the run anew, without --resume and naming "
                      f"what it trains: crl-bench run {' '.join(options)} --out {path}")


def _stored_config(run: Any, validate: bool = True) -> Any:
    """The run's ``config.json`` as a RunConfig; a damaged file is named, with the way out."""
    from crl_bench.config.schema import ConfigError, config_from_dict

    path = run.config_path
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ConfigError(f"expected a JSON object, got {type(data).__name__}")
        cfg = config_from_dict({k: v for k, v in data.items()
                                if k not in ("agent_options", "task_names", "env_ids", "host")})
        if validate:
            cfg.validate()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ConfigError) as exc:
        raise ConfigError(f"{path} is not a valid run configuration ({exc}). It cannot be "
                          "resumed: restore the file, or start a new run with another --out.") from None
    return cfg


def _check_identity(cfg: Any, run: Any, **given: Any) -> None:
    """A resumed run keeps its agent, tasks, seed and preset; a different one given is refused."""
    from crl_bench.config.schema import ConfigError

    option = {"agent": "--agent", "tasks": "--tasks", "seed": "--seed", "preset": "--preset"}
    differ = [f"{option[k]} {v} (stored: {getattr(cfg, k)})" for k, v in given.items()
              if v is not None and v != getattr(cfg, k)]
    if differ:
        raise ConfigError(f"--resume continues the run stored in {run.path}, which differs: "
                          f"{'; '.join(differ)}. Leave these options out to continue it, or start "
                          "a new run with another --out.")


FINGERPRINT_FILE = "fingerprint.json"
"""The run's identity and training fields as it started, with a SHA-256 sidecar: a resume
compares ``config.json`` against it (every field but ``steps`` and the resumable speed
settings)."""


def fingerprint_fields(cfg: Any) -> dict[str, Any]:
    """See :func:`crl_bench.records.checksums.fingerprint_fields` (kept there so that a
    checkpoint can record it too)."""
    from crl_bench.records.checksums import fingerprint_fields as fields

    return fields(cfg)


def record_fingerprint(run: Any, cfg: Any) -> None:
    """Write ``fingerprint.json`` (and its checksum) for a run that starts now."""
    from crl_bench.records.checksums import write_file_checksum

    fields = fingerprint_fields(cfg)
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    path = run.path / FINGERPRINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{FINGERPRINT_FILE}.tmp")
    tmp.write_text(json.dumps({"sha256": digest, "fields": fields}, indent=1, sort_keys=True))
    os.replace(tmp, path)
    write_file_checksum(path)


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def check_fingerprint(run: Any, cfg: Any) -> None:
    """Refuse to resume when ``config.json`` no longer matches the fingerprint the run started
    with (an edit of the agent, seed, learning rate, ... would mix two configurations in one
    run's records). A run from before fingerprints were kept gets one now, with a warning."""
    from crl_bench.records.checksums import ChecksumError, verify_file_checksum
    from crl_bench.config.schema import ConfigError

    path = run.path / FINGERPRINT_FILE
    way_out = ("Restore config.json (the values the run started with are in "
               f"{path}), or start a new run with another --out.")
    if not path.is_file():
        if _recorded_in_checkpoint(run.last_checkpoint()) is not None:
            return  # compared with the checkpoint's record (check_checkpoint_fingerprint)
        print(f"[resume] warning: {run.path} has no {FINGERPRINT_FILE} (a run started before "
              "fingerprints were kept): its config.json is taken as it is now, and fingerprinted "
              "from here on.", file=sys.stderr)
        record_fingerprint(run, cfg)
        return
    try:
        if not verify_file_checksum(path):
            raise ChecksumError(path, "has no checksum beside it (it was written with one)")
        data = json.loads(path.read_text())
        started = data["fields"]
        if not isinstance(started, dict):
            raise ValueError("no fields")
    except (ChecksumError, OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--resume: the run's fingerprint cannot be trusted ({exc}). Restore "
                          f"{path} and {path.name}.sha256, or start a new run with another "
                          "--out.") from None
    changed = _changed_fields(started, cfg)
    if changed:
        more = f" (and {len(changed) - 6} more)" if len(changed) > 6 else ""
        raise ConfigError(f"--resume: {run.config_path} was changed since the run started: "
                          f"{'; '.join(changed[:6])}{more}. A resumed run must keep its "
                          f"configuration. {way_out}")


def _recorded_in_checkpoint(checkpoint: Path | None) -> dict[str, Any] | None:
    """The fingerprint a checkpoint recorded (``loop_state.json["fingerprint"]``), or None: no
    checkpoint, or one written before checkpoints recorded it (or unreadable: the checkpoint's
    own verification names that)."""
    if checkpoint is None:
        return None
    try:
        state = json.loads((checkpoint / "loop_state.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    recorded = state.get("fingerprint") if isinstance(state, dict) else None
    return recorded if isinstance(recorded, dict) else None


def check_checkpoint_fingerprint(run: Any, checkpoint: Path, cfg: Any) -> None:
    """Refuse to resume from ``checkpoint`` (already verified against its checksums) when the
    fingerprint it recorded disagrees with ``config.json``: the differing fields named, or the
    fingerprint when its fields cannot be read. This holds with ``fingerprint.json`` and its
    checksum deleted; ``fingerprint.json`` is then written again from the checkpoint's record.
    A checkpoint without a record (older) changes nothing (:func:`check_fingerprint` warns)."""
    from crl_bench.records.checksums import fingerprint_digest, fingerprint_fields as fields_of
    from crl_bench.config.schema import ConfigError

    recorded = _recorded_in_checkpoint(checkpoint)
    if recorded is None:
        return
    where = checkpoint / "loop_state.json"
    way_out = (f"Restore config.json (the values the run's checkpoint was written with are in "
               f"{where}, 'fingerprint'), or start a new run with another --out.")
    started = recorded.get("fields")
    if isinstance(started, dict):
        changed = _changed_fields(started, cfg)
        if changed:
            more = f" (and {len(changed) - 6} more)" if len(changed) > 6 else ""
            raise ConfigError(f"--resume: {run.config_path} disagrees with the fingerprint "
                              f"recorded in the checkpoint {checkpoint.name}: "
                              f"{'; '.join(changed[:6])}{more}. A resumed run must keep its "
                              f"configuration. {way_out}")
    elif recorded.get("sha256") != fingerprint_digest(fields_of(cfg)):
        raise ConfigError(f"--resume: {run.config_path} disagrees with the fingerprint "
                          f"(sha256 {str(recorded.get('sha256'))[:12]}...) recorded in the "
                          f"checkpoint {checkpoint.name}. A resumed run must keep its "
                          f"configuration. {way_out}")
    if not (run.path / FINGERPRINT_FILE).is_file():
        record_fingerprint(run, cfg)  # the checkpoint vouched for config.json


def _changed_fields(started: dict[str, Any], cfg: Any) -> list[str]:
    """``"field: old -> new"`` for each fingerprint field ``cfg`` changed since ``started``
    (a field recorded under its old spelling is compared under its name now)."""
    from crl_bench.config.schema import RunConfig, canonical_key

    started = {canonical_key(key): value for key, value in started.items()}
    now = fingerprint_fields(cfg)
    defaults = fingerprint_fields(RunConfig())
    changed = []
    for key in sorted(set(started) | set(now)):
        if key not in started:
            if now[key] != defaults.get(key, now[key]):  # a field newer than the run: default ok
                changed.append(f"{key}: (not set) -> {_shown(now[key])}")
        elif key not in now:
            continue  # a field this version no longer has
        elif started[key] != now[key]:
            changed.append(f"{key}: {_shown(started[key])} -> {_shown(now[key])}")
    return changed


def _run_locked(run: Any, *, agent: str | None, tasks: str | None, preset: str | None,
                seed: int | None, steps: int | None, overrides: dict[str, Any] | None,
                resume: bool, progress: bool, repair: bool,
                ray: dict[str, Any] | None = None, new: tuple[Any, Any] | None = None) -> Path:
    from crl_bench.config.schema import ConfigError, apply_resume_overrides
    from crl_bench.run.context import RunContext
    from crl_bench.run.loop import RunLoop, write_config

    status = run.status()
    checkpoint, start = None, 0
    resuming = resume and run.config_path.exists()
    if resuming:
        done = status.get("state") == "done"
        cfg = _stored_config(run, validate=False)  # validated below, once final
        _check_identity(cfg, run, agent=agent, tasks=tasks, seed=seed, preset=preset)
        check_fingerprint(run, cfg)  # config.json edited by hand since the run started
        if done and (steps is None or steps <= cfg.steps):
            return run.path  # finished; a larger --steps continues it (its last evaluation stays)
        if steps is not None:
            cfg.steps = steps
        cfg = apply_resume_overrides(cfg, overrides)
        try:
            cfg.validate()
        except ConfigError as exc:
            raise ConfigError(f"{run.config_path} is not a valid run configuration ({exc}). It "
                              "cannot be resumed: restore the file (or change the --steps / --set "
                              "given), or start a new run with another --out.") from None
        agent_obj = _checked_agent(cfg)  # everything is checked before anything is built
    else:
        if run.config_path.exists() and status.get("state") != "missing":
            raise FileExistsError(f"{run.path} already holds a run ({status.get('state')}); pass "
                                  "--resume to continue it, or choose another --out.")
        cfg, agent_obj = new or _new_run_config(agent, tasks, preset, seed, steps, overrides)
    if resuming:
        # damaged records and checkpoints are found (and named) before the model is built
        if repair:
            moved = run.repair_records()
            for name, lines in moved.items():
                print(f"[repair] {name}: moved {len(lines)} damaged line(s) "
                      f"({', '.join(map(str, lines[:10]))}{' ...' if len(lines) > 10 else ''}) "
                      f"to {run.path / (name + '.bad')}")
        else:
            run.check_records()
        checkpoint = run.last_checkpoint()
        if checkpoint is not None:
            start = run.verify_checkpoint(checkpoint)
            check_checkpoint_fingerprint(run, checkpoint, cfg)  # even without fingerprint.json
            if start > cfg.steps:
                raise ConfigError(
                    f"the checkpoint in {checkpoint} is at step {start}, beyond the run's "
                    f"steps={cfg.steps}: a run cannot go back. Pass --steps {start} or more to "
                    "continue it, or start a new run with another --out.")
            if start == cfg.steps:  # the crash came after the last step's checkpoint
                run.truncate_after(start)
                run.set_status("done", start)
                return run.path
    if not resuming:
        _keep_start_bank(run)  # before anything opens the bank
    context: Any = RunContext
    if ray is not None:  # envs, generation, learner, bank, extractor on a Ray cluster
        from crl_bench.distributed.context import ray_context

        context = ray_context(**ray)
    trainer = RunLoop(cfg, agent_obj, run, progress=progress, context=context)
    write_config(run, cfg, agent_obj, trainer.tasks)
    if not resuming:
        record_fingerprint(run, cfg)  # what config.json says now is what a resume must find
    try:
        if checkpoint is None and resuming:
            _restore_start_bank(run)  # the dead attempt's entries must not be retrieved
        trainer.setup()
        if checkpoint is not None:
            try:  # each part's state, the bank too (the experience part's)
                start = trainer.load_checkpoint(checkpoint)
            except Exception as exc:
                raise CheckpointLoadError(
                    f"the checkpoint in {checkpoint} cannot be loaded ({type(exc).__name__}: "
                    f"{exc}). Move it aside (mv {checkpoint} {checkpoint.parent / 'broken'}) and "
                    "run --resume again to restart from step 0, or start a new run with another "
                    "--out.") from exc
            dropped = run.truncate_after(start)
            if any(dropped.values()):
                print(f"[resume] continuing after step {start}; dropped records of unfinished steps: {dropped}")
        else:
            run.truncate_after(-1)  # a crash before the first checkpoint: start clean
        run.set_status("running", start)
        trainer.reached("startup")
        trainer.run_steps(start)
    except BaseException as exc:
        run.set_status("failed", trainer.step, error=f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc()[-4000:])
        _close_after_failure(trainer, exc)
        raise
    trainer.close()
    return run.path


def _keep_start_bank(run: Any) -> None:
    """Record the bank as this new run finds it (a copy, or a marker that there was none), so
    that a crash before the first checkpoint restarts from it. A record left by an earlier
    attempt that died before opening the bank is the true start and is kept."""
    from crl_bench.experience.bank_files import snapshot_bank

    if run.start_bank_path.is_file() or run.no_start_bank_path.is_file():
        return
    run.start_bank_path.parent.mkdir(parents=True, exist_ok=True)
    if run.bank_path.is_file():
        from crl_bench.records.checksums import write_file_checksum

        snapshot_bank(run.bank_path, run.start_bank_path)
        write_file_checksum(run.start_bank_path)
    else:
        run.no_start_bank_path.write_text("the run started without an experience bank\n")


def _restore_start_bank(run: Any) -> None:
    """A crash before the first checkpoint: the bank goes back to the run's start (the copy, or
    no bank at all); a run from before start records were kept keeps its bank, with a warning."""
    from crl_bench.experience.bank_files import remove_bank, restore_bank

    if run.start_bank_path.is_file():
        check_start_bank(run)  # before it is copied over the run's bank
        restore_bank(run.start_bank_path, run.bank_path)
    elif run.no_start_bank_path.is_file():
        remove_bank(run.bank_path)
    elif run.bank_path.exists():
        print(f"[resume] warning: {run.path} holds no record of its bank at start; restarting "
              f"from step 0 with {run.bank_path} as the dead attempt left it.")


def check_start_bank(run: Any) -> None:
    """The run's copy of its bank at start, against its checksum and as a database."""
    from crl_bench.experience.bank_files import bank_file_problem
    from crl_bench.records.checksums import ChecksumError, verify_file_checksum
    from crl_bench.records.files import CheckpointError

    path = run.start_bank_path
    way_out = ("Restore it, or start a new run with another --out (the run has no checkpoint "
               "yet, so nothing trained is lost).")
    try:
        verify_file_checksum(path)
    except ChecksumError as exc:
        raise CheckpointError(f"{exc}. {way_out}") from None
    problem = bank_file_problem(path)
    if problem is not None:
        raise CheckpointError(f"{path} {problem}. {way_out}")


class CheckpointLoadError(RuntimeError):
    """A checkpoint passed the file checks but could not be loaded into the trainer."""


def _close_after_failure(trainer: Any, exc: BaseException) -> None:
    """Close what was built without hiding ``exc``: a failure inside ``setup`` leaves parts unset,
    and an error from closing them must not replace the real cause."""
    try:
        trainer.close()
    except Exception as close_exc:  # reported beside the cause, never instead of it
        exc.add_note(f"(while cleaning up after it: {type(close_exc).__name__}: {close_exc})")
