"""The extractor track: distil finished trajectories into the bank and train the extractor.

It runs beside the actor loop (a background thread by default). The actor loop hands it each
step's finished trajectories with :meth:`ExtractorTrack.submit` and never waits for it. For each
trajectory the extractor reads the goal, the trajectory (experience block removed), the outcome
and the entries that were retrieved, and writes up to three operations. Each extraction is an
*extractor sample* whose credit is resolved later, when trajectories that used the entries it
wrote finish (:meth:`record_usage`, called by the actor loop):

    r(sample) = mean over those trajectories of (score if score > 0 else -1);  malformed -> -1

Credited samples wait in a pool; when ``buffer_size`` of them are ready the extractor is
updated with CISPO on ``(r - mean r)`` times the count-aware weight ``(1 + n_trained)^-power``
(0 inside the cooldown). A sample is trained at most ``max_reuse`` times; one whose entries are
never used within ``credit_horizon`` steps is dropped. Search-and-Ask answers are samples too,
credited with the outcome of the trajectory that asked.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from crl_bench.runner.memory import release_free_memory
from crl_bench.runner.trainer import RoleTrainer, TrainSample


@dataclass
class ExtractorSample:
    """One extractor call to learn from, with its credit bookkeeping."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    kind: str                      # "extract" | "ask"
    created_step: int
    malformed: bool = False
    entry_ids: list[int] = field(default_factory=list)
    usage: list[float] = field(default_factory=list)
    times_trained: int = 0
    last_trained_step: int = -1

    @property
    def resolved(self) -> bool:
        return self.malformed or bool(self.usage)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ExtractorTrack:
    """Background distillation + extractor training.

    Args:
        manager: the ExperienceManager (bank writes go through it).
        generate: ``generate(list of chat message lists) -> list[Generation]`` with the extractor role.
        trainer: the extractor's :class:`RoleTrainer`, or None when the extractor is frozen.
        cfg: :class:`crl_bench.runner.config.ExtractorConfig`.
        merge_every: merge the bank every this many actor steps (0: never).
        count_reweight: use count-aware weights (False: weight 1, no cooldown).
        asynchronous: run in a thread (False: :meth:`submit` processes inline).
        run_name: recorded as the provenance of the entries this track writes.
    """

    def __init__(self, manager: Any, generate: Callable[[list[list[dict]]], list[Any]],
                 trainer: RoleTrainer | None, cfg: Any, *, temperature: float, merge_every: int, merge_chunk: int,
                 count_reweight: bool, asynchronous: bool, log: Callable[[dict[str, Any]], None],
                 run_name: str = "") -> None:
        self.manager = manager
        self.generate = generate
        self.trainer = trainer
        self.cfg = cfg
        self.temperature = temperature
        self.merge_every = merge_every
        self.merge_chunk = merge_chunk
        self.count_reweight = count_reweight
        self.asynchronous = asynchronous
        self.log = log
        self.run_name = run_name
        from crl_bench.extractor.extraction import ANSWER_TEMPLATES

        self.template = ANSWER_TEMPLATES[cfg.answer_template]
        self.samples: list[ExtractorSample] = []
        self._entry_to_samples: dict[int, list[ExtractorSample]] = {}
        self._state_lock = threading.RLock()
        self._queue: queue.Queue[tuple[int, list[Any]] | None] = queue.Queue()
        self._pending: list[tuple[int, list[dict[str, Any]]]] = []  # for checkpoints
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._submitted = 0
        self._done = 0
        self.updates = 0
        self.last_merge_step = 0
        self.stats: dict[str, float] = {"extractions": 0, "malformed": 0, "ops_applied": 0,
                                        "merges": 0, "dropped_uncredited": 0}
        self._thread: threading.Thread | None = None
        if asynchronous:
            self._thread = threading.Thread(target=self._worker, name="extractor-track", daemon=True)
            self._thread.start()

    # -- actor-loop side -----------------------------------------------------------------------
    def submit(self, step: int, trajectories: list[Any]) -> None:
        self.raise_if_failed()
        with self._state_lock:
            self._pending.append((step, [t.to_json() for t in trajectories]))
        if self.asynchronous:
            with self._cond:
                self._submitted += 1
            self._queue.put((step, trajectories))
        else:
            self._process(step, trajectories)

    def add_ask_samples(self, samples: list[ExtractorSample], score: float) -> None:
        """Search-and-Ask answers of one episode, credited with that episode's ``score``."""
        with self._state_lock:
            for s in samples:
                s.usage.append(float(score))
            self.samples.extend(samples)

    def credit(self, trajectories: list[Any]) -> None:
        """The usage ledger: each with-experience trajectory credits the entries it used, in the
        bank (outcome counts) and in the extractor samples that wrote them."""
        for t in trajectories:
            if t.with_experience and t.experience_ids:
                self.record_usage(t.experience_ids, t.score)
                self.manager.record_outcomes(t.experience_ids, t.score)

    def record_usage(self, entry_ids: list[int], score: float) -> None:
        """A finished trajectory used these entries and ended with ``score``."""
        with self._state_lock:
            for eid in entry_ids:
                for sample in self._entry_to_samples.get(int(eid), []):
                    sample.usage.append(float(score))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted batch is processed (used at the end and in tests)."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._done >= self._submitted or self._error is not None,
                                     timeout)
        self.raise_if_failed()
        return ok

    @property
    def backlog(self) -> int:
        """Submitted batches not yet processed."""
        with self._cond:
            return self._submitted - self._done

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"extractor track failed: {self._error}") from self._error

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=600)

    # -- worker --------------------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._process(*item)
            except BaseException as exc:  # surfaced to the actor loop at its next submit
                self._error = exc
                traceback.print_exc()
            finally:
                with self._cond:
                    self._done += 1
                    self._cond.notify_all()

    def _process(self, step: int, trajectories: list[Any]) -> None:
        from crl_bench.extractor.merge import merge_bank
        from crl_bench.extractor.extraction import (build_extraction_messages, parse_operations,
                                                     trajectory_to_text)

        t0 = time.perf_counter()
        messages, metas = [], []
        for traj in trajectories:
            retrieved = self.manager.bank.get(list(traj.experience_ids)) if traj.experience_ids else []
            pairs = [(turn.observation, turn.completion_text if turn.action is None else turn.action)
                     for turn in traj.turns]
            text = trajectory_to_text(pairs, max_chars=self.cfg.max_trajectory_chars)
            outcome = {"success": traj.success, "score": traj.score, "n_actions": traj.n_actions}
            msgs = build_extraction_messages(traj.goal, text, outcome, retrieved)
            prefill = ""
            if self.template is not None:
                prefill = self.template.prefill(traj.goal, bool(traj.success))
                msgs.append({"role": "assistant", "content": prefill})
            messages.append(msgs)
            metas.append((traj, {e.id for e in retrieved}, prefill))
        if not messages:
            generations = []
        elif self.template is not None:
            generations = self.generate(messages, stop=self.template.stop)
        else:
            generations = self.generate(messages)
        # bank writes and the pending list change together: a checkpoint (state() under the
        # same lock, with the bank backup) sees a batch either wholly applied or still pending
        with self._state_lock:
            new_samples = []
            for gen, (traj, retrieved_ids, prefill) in zip(generations, metas):
                answer = gen.text if self.template is None else self.template.answer(prefill, gen.text)
                ops, malformed = parse_operations(answer, valid_target_ids=retrieved_ids,
                                                  max_ops=self.cfg.max_ops)
                written: list[int] = []
                if not malformed and ops:
                    written = self.manager.apply_operations(
                        ops, family=traj.meta.get("family", ""), task_id=traj.task_id,
                        provenance={"run": self.run_name,
                                    "trajectories": [f"{traj.task_name}/seed{traj.seed}/group{traj.group_id}"]},
                        step=step)
                sample = ExtractorSample(list(gen.prompt_ids), list(gen.completion_ids), list(gen.logprobs),
                                         kind="extract", created_step=step, malformed=malformed,
                                         entry_ids=[int(i) for i in written])
                new_samples.append(sample)
                self.stats["extractions"] += 1
                self.stats["malformed"] += int(malformed)
                self.stats["ops_applied"] += len(written)
            for s in new_samples:
                if s.malformed or s.entry_ids:
                    self.samples.append(s)
                    for eid in s.entry_ids:
                        self._entry_to_samples.setdefault(eid, []).append(s)
            self._pending = [(st, tr) for st, tr in self._pending if st != step]
        metrics: dict[str, Any] = {"step": step, "extractor/extract_s": time.perf_counter() - t0,
                                   "extractor/malformed_frac": sum(s.malformed for s in new_samples)
                                   / max(1, len(new_samples))}
        if self.merge_every and step - self.last_merge_step >= self.merge_every:
            t1 = time.perf_counter()
            result = merge_bank(self.manager, self.generate, step=step, chunk=self.merge_chunk)
            self.last_merge_step = step
            self.stats["merges"] += 1
            metrics["extractor/merge_s"] = time.perf_counter() - t1
            metrics.update({f"bank/merge_{k}": v for k, v in _merge_counts(result).items()})
        metrics.update(self._maybe_train(step))
        self.log(metrics)

    def _maybe_train(self, step: int) -> dict[str, Any]:
        import torch

        from crl_bench.algorithms.credit import count_aware_weights, extractor_advantages, extractor_rewards

        with self._state_lock:
            # drop samples whose entries were never used in time
            keep = []
            for s in self.samples:
                if not s.resolved and step - s.created_step > self.cfg.credit_horizon:
                    self.stats["dropped_uncredited"] += 1
                    continue
                keep.append(s)
            self.samples = keep
            ready = [s for s in self.samples if s.resolved and s.times_trained < self.cfg.max_reuse]
        out: dict[str, Any] = {"extractor/pool": len(self.samples), "extractor/ready": len(ready)}
        if self.trainer is None or len(ready) < self.cfg.buffer_size:
            return out
        rewards = extractor_rewards([s.usage for s in ready], [s.malformed for s in ready])
        adv = extractor_advantages(rewards)
        if self.count_reweight:
            weights = count_aware_weights(torch.tensor([s.times_trained for s in ready]),
                                          torch.tensor([s.last_trained_step for s in ready]), self.updates,
                                          power=self.cfg.count_power, cooldown=self.cfg.cooldown)
        else:
            weights = torch.ones(len(ready))
        batch = [TrainSample(s.prompt_ids, s.completion_ids, s.logprobs, float(a), float(w))
                 for s, a, w in zip(ready, adv.tolist(), weights.tolist())]
        m = self.trainer.update(batch, loss=self.cfg.loss,
                                loss_kwargs=self.cfg.loss_kwargs(),
                                agg=self.cfg.agg, temperature=self.temperature)
        trained_entries: list[int] = []
        with self._state_lock:
            for s, w in zip(ready, weights.tolist()):
                if w > 0:
                    s.times_trained += 1
                    s.last_trained_step = self.updates
                    trained_entries.extend(s.entry_ids)
            self.samples = [s for s in self.samples if s.times_trained < self.cfg.max_reuse]
        if trained_entries:  # the bank's own count, for `crl-bench bank` and the report
            self.manager.mark_trained(sorted(set(trained_entries)), step)
        self.updates += 1
        release_free_memory()
        out.update({f"losses/extractor_{k}": v for k, v in m.items()})
        out["extractor/reward_mean"] = float(rewards.mean())
        out["extractor/updates"] = self.updates
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self, also: Callable[[], Any] | None = None) -> dict[str, Any]:
        """The pool, counters and unprocessed batches; ``also()`` (e.g. a bank backup) runs
        under the same lock, so the two agree: no batch half applied to the bank."""
        with self._state_lock:
            if also is not None:
                also()
            return {"samples": [s.to_json() for s in self.samples], "updates": self.updates,
                    "last_merge_step": self.last_merge_step, "stats": dict(self.stats),
                    "pending": list(self._pending)}

    def load_state(self, state: dict[str, Any], trajectory_cls: Any) -> list[tuple[int, list[Any]]]:
        """Restore the pool; returns the unprocessed batches (to resubmit)."""
        with self._state_lock:
            self.samples = [ExtractorSample(**s) for s in state["samples"]]
            self._entry_to_samples = {}
            for s in self.samples:
                for eid in s.entry_ids:
                    self._entry_to_samples.setdefault(eid, []).append(s)
            self.updates = int(state["updates"])
            self.last_merge_step = int(state["last_merge_step"])
            self.stats.update(state["stats"])
        return [(st, [trajectory_cls.from_json(t) for t in trs]) for st, trs in state.get("pending", [])]


def _merge_counts(result: Any) -> dict[str, float]:
    out = {}
    for key in ("merged", "rewritten", "discarded", "kept", "malformed", "deleted", "added"):
        val = getattr(result, key, None)
        if val is None:
            continue
        out[key] = float(len(val) if hasattr(val, "__len__") else val)
    return out
