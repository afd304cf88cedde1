"""The extractor track: the extractor's verbs, and the thread that runs them beside the actor.

The verbs (what one extractor step is made of; the agent strings them together, see
``extractor_step`` in ``baselines/comp_rl.py``):

* :meth:`ExtractorTrack.distil`: for each trajectory the extractor reads the goal, the
  trajectory (experience block removed), the outcome and the entries that were retrieved, and
  writes up to three bank operations. Each extraction is an *extractor sample* whose credit is
  resolved later, when trajectories that used the entries it wrote finish;
* :meth:`ExtractorTrack.credit` (called on the actor's side): those trajectories credit the
  entries, hence the samples that wrote them (:func:`crl_bench.algorithms.credit.extractor_reward`);
* :meth:`ExtractorTrack.merge`: consolidate the bank every ``merge_every`` steps;
* :meth:`ExtractorTrack.train`: CISPO on the credited samples the sample policy hands over,
  with count-aware weights.

The actor loop hands each step's finished trajectories to :meth:`ExtractorTrack.submit` and
never waits for them (a background thread by default; ``asynchronous=False`` runs inline).

Two sample policies (``extractor.sample_policy``, :class:`PoolPolicy` and :class:`BufferPolicy`):

* ``pool``: credited samples wait in a pool; when ``buffer_size`` of them are ready the extractor
  is updated on all of them with CISPO on ``(r - mean r)`` times the count-aware weight
  ``(1 + n_trained)^-power`` (0 inside the cooldown). A sample is trained at most ``max_reuse``
  times; one whose entries are never used within ``credit_horizon`` steps is dropped.
* ``buffer`` (official, ``multi_agentic_pipeline.py:55-108, 776-815, 1105-1111``): a sample
  enters a FIFO buffer of ``buffer_size`` entries when retrieval credits it (the oldest is
  evicted when full); when the buffer holds ``buffer_size`` samples exactly that many are popped
  and trained once, each on the mean of the credit it gathered since it entered; credited again
  later, it re-enters with only the new credit.

Search-and-Ask answers are samples too, credited with the outcome of the trajectory that asked;
with ``extractor.train_merges`` so are merge calls, credited by the use of the entries they
created. With the gate on (:mod:`crl_bench.extractor.gate`) an episode credits its entries with
:func:`~crl_bench.algorithms.credit.gate_credit` of its score and the verdict.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import OrderedDict
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from crl_bench.llm.types import TrainSample
from crl_bench.memory import release_free_memory


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
    uid: int = -1
    """Unique within a run (the buffer's key)."""

    @property
    def resolved(self) -> bool:
        return self.malformed or bool(self.usage)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PoolPolicy:
    """``sample_policy="pool"``: every credited sample waits in the track's pool; once
    ``buffer_size`` are ready all of them are trained, each until it was trained ``max_reuse``
    times (its count-aware weight shrinking); one whose entries are never used within
    ``credit_horizon`` steps is dropped. Called under the track's state lock."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def credited(self, track: "ExtractorTrack", sample: ExtractorSample) -> None:
        """A sample gained credit (nothing to do: the pool is the track's sample list)."""

    def take(self, track: "ExtractorTrack", step: int, can_train: bool
             ) -> tuple[dict[str, Any], list[ExtractorSample], list[list[float]]]:
        """The samples to train now and their credit (empty: not yet), with the pool's figures."""
        keep = []
        for s in track.samples:  # drop samples whose entries were never used in time
            if not s.resolved and step - s.created_step > self.cfg.credit_horizon:
                track.stats["dropped_uncredited"] += 1
                continue
            keep.append(s)
        track.samples = keep
        ready = [s for s in track.samples if s.resolved and s.times_trained < self.cfg.max_reuse]
        out: dict[str, Any] = {"extractor/pool": len(track.samples), "extractor/ready": len(ready)}
        if not can_train or len(ready) < self.cfg.buffer_size:
            return out, [], []
        return out, ready, [s.usage for s in ready]

    def trained(self, track: "ExtractorTrack") -> None:
        track.samples = [s for s in track.samples if s.times_trained < self.cfg.max_reuse]

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": []}

    def load_state_dict(self, state: dict[str, Any], by_uid: dict[int, ExtractorSample]) -> None:
        pass


class BufferPolicy:
    """``sample_policy="buffer"`` (official ``MemoryTrainingBuffer``): a credited sample enters a
    FIFO buffer of ``buffer_size`` (a full buffer evicts its oldest sample, whose credit is
    lost); when it holds ``buffer_size`` samples they are popped and trained once, each on the
    credit it gathered in the buffer. Called under the track's state lock."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.buffer: OrderedDict[int, ExtractorSample] = OrderedDict()
        """Credited samples in the order they entered (FIFO)."""

    def credited(self, track: "ExtractorTrack", sample: ExtractorSample) -> None:
        """``MemoryTrainingBuffer.add``: join the buffer (already in: the credit accumulates)."""
        if sample.uid in self.buffer:
            return
        if len(self.buffer) >= self.cfg.buffer_size:
            _, old = self.buffer.popitem(last=False)
            old.usage = []
            track.stats["buffer_evicted"] += 1
        self.buffer[sample.uid] = sample

    def take(self, track: "ExtractorTrack", step: int, can_train: bool
             ) -> tuple[dict[str, Any], list[ExtractorSample], list[list[float]]]:
        """``_maybe_train_memory_model_from_buffer``: exactly ``buffer_size`` samples (the oldest
        first) once the buffer holds that many; each leaves it and re-enters with new credit only."""
        # a sample outside the buffer whose entries have all left the bank (replaced, merged,
        # evicted) can never be credited again: let it go
        alive = {e.id for e in track.manager.get(sorted({i for s in track.samples for i in s.entry_ids}))}
        track.samples = [s for s in track.samples if s.uid in self.buffer
                         or any(i in alive for i in s.entry_ids)]
        track.index_samples()
        out: dict[str, Any] = {"extractor/pool": len(track.samples), "extractor/ready": len(self.buffer)}
        if not can_train or len(self.buffer) < self.cfg.buffer_size:
            return out, [], []
        batch = [self.buffer.popitem(last=False)[1] for _ in range(self.cfg.buffer_size)]
        usage = [list(s.usage) for s in batch]
        for s in batch:
            s.usage = []
        return out, batch, usage

    def trained(self, track: "ExtractorTrack") -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self.buffer)}

    def load_state_dict(self, state: dict[str, Any], by_uid: dict[int, ExtractorSample]) -> None:
        self.buffer = OrderedDict((u, by_uid[u]) for u in state.get("buffer", []) if u in by_uid)


SAMPLE_POLICIES: dict[str, type] = {"pool": PoolPolicy, "buffer": BufferPolicy}

ExtractorStep = Callable[["ExtractorTrack", int, list[Any]], dict[str, Any]]
"""``extractor_step(track, step, trajectories) -> metrics``: the agent's extractor step, made of
the track's verbs (``baselines/comp_rl.py``)."""


class ExtractorTrack:
    """The extractor's verbs on the shared bank, run by ``extractor_step`` in the background.

    Args:
        manager: the ExperienceManager (bank writes go through it).
        generate: ``generate(list of chat message lists) -> list[Generation]`` with the extractor role.
        trainer: the extractor's trainer (``update(samples, ...)``, a
            :class:`~crl_bench.training.role_trainer.RoleTrainer`), or None when the extractor is frozen.
        cfg: :class:`crl_bench.config.schema.ExtractorConfig`.
        extractor_step: what one submitted batch goes through (see :data:`ExtractorStep`).
        merge_every: merge the bank every this many actor steps (0: never).
        merge_scope: what one merge window may mix (``experience.merge_scope``).
        fence_merges: official fencing: merges run only inside the actor's pre-rollout flush
            (the run calls :meth:`merge`), never in the extractor's own step.
        asynchronous: run in a thread (False: :meth:`submit` processes inline).
        run_name: recorded as the provenance of the entries this track writes.
    """

    def __init__(self, manager: Any, generate: Callable[[list[list[dict]]], list[Any]],
                 trainer: Any, cfg: Any, *, extractor_step: ExtractorStep, temperature: float,
                 merge_every: int, merge_chunk: int, asynchronous: bool,
                 merge_scope: str = "family",
                 log: Callable[[dict[str, Any]], None], run_name: str = "",
                 key_by_episode_start: bool = False, fence_merges: bool = False) -> None:
        self.manager = manager
        self.generate = generate
        self.trainer = trainer
        self.cfg = cfg
        self.extractor_step = extractor_step
        self.temperature = temperature
        self.merge_every = merge_every
        self.merge_chunk = merge_chunk
        self.merge_scope = merge_scope
        self.asynchronous = asynchronous
        self.log = log
        self.run_name = run_name
        self.key_by_episode_start = key_by_episode_start
        self.policy = SAMPLE_POLICIES[cfg.sample_policy](cfg)
        self._uids = itertools.count()
        self._writes_done = 0
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
        self._batch_steps: list[int] = []  # the step of each batch handed to the thread, in order
        self.updates = 0
        self.last_merge_step = 0
        self.fence_merges = fence_merges
        self._training_now = False
        self._uncollected = False
        self.stats: dict[str, float] = {"extractions": 0, "malformed": 0, "ops_applied": 0,
                                        "merges": 0, "dropped_uncredited": 0, "buffer_evicted": 0,
                                        "not_distilled": 0}
        self._thread: threading.Thread | None = None
        if asynchronous:
            self._thread = threading.Thread(target=self._worker, name="extractor-track", daemon=True)
            self._thread.start()

    @property
    def buffer(self) -> "OrderedDict[int, ExtractorSample]":
        """The buffer policy's FIFO (empty under the pool policy)."""
        return getattr(self.policy, "buffer", OrderedDict())

    # -- actor-loop side -----------------------------------------------------------------------
    def submit(self, step: int, trajectories: list[Any]) -> None:
        """Hand over a step's finished trajectories: ``extractor_step`` runs on them, in the
        background (or inline when not asynchronous)."""
        self.raise_if_failed()
        with self._state_lock:
            self._pending.append((step, [t.to_json() for t in trajectories]))
        if self.asynchronous:
            with self._cond:
                self._submitted += 1
                self._batch_steps.append(step)
            self._queue.put((step, trajectories))
        else:
            self._process(step, trajectories)

    def add_ask_samples(self, samples: list[ExtractorSample], score: float) -> None:
        """Search-and-Ask answers of one episode, credited with that episode's ``score``."""
        with self._state_lock:
            for s in samples:
                self._register(s)
                s.usage.append(float(score))
                if s.malformed and not self.cfg.train_malformed:
                    continue
                self.samples.append(s)
                self.policy.credited(self, s)

    def credit(self, trajectories: list[Any]) -> None:
        """The usage ledger: each with-experience trajectory credits the entries it used, in the
        bank (outcome counts) and in the extractor samples that wrote them
        (:func:`~crl_bench.algorithms.credit.gate_credit` of its score and the gate's verdict)."""
        from crl_bench.algorithms.credit import gate_credit

        for t in trajectories:
            # credit_ids: entries dropped by an unparseable gate verdict whose writers are still
            # credited with the plain score (experience.gate_invalid_credit, official)
            ids = t.experience_ids or t.meta.get("credit_ids", [])
            if t.with_experience and ids:
                value = gate_credit(t.score, t.meta.get("gate"))
                self.record_usage(ids, value)
                self.manager.record_outcomes(ids, value)

    def record_usage(self, entry_ids: list[int], score: float) -> None:
        """A finished trajectory used these entries and gave them ``score`` (its credit value)."""
        with self._state_lock:
            for eid in entry_ids:
                for sample in self._entry_to_samples.get(int(eid), []):
                    sample.usage.append(float(score))
                    self.policy.credited(self, sample)

    def _register(self, sample: ExtractorSample) -> None:
        if sample.uid < 0:
            sample.uid = next(self._uids)

    def index_samples(self) -> None:
        """Rebuild the entry id -> samples map from the sample list."""
        self._entry_to_samples = {}
        for smp in self.samples:
            for eid in smp.entry_ids:
                self._entry_to_samples.setdefault(eid, []).append(smp)

    def wait_writes(self, timeout: float | None = None) -> bool:
        """Block until the bank writes (distillation and merge) of every submitted batch are
        done; the extractor's own training may still be running."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._writes_done >= self._submitted or self._error is not None, timeout)
        self.raise_if_failed()
        return ok

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

    def bank_lag(self, step: int) -> int:
        """How many steps the bank is behind when ``step``'s rollout starts: ``step`` minus the
        step of the oldest batch whose bank writes have not landed (the thread takes batches in
        order), 0 when every earlier batch's writes have landed, as after the official flush.

        An extractor that works beside the actor but falls behind defers work rather than
        removing it: the actor's wait (``timing_s/extractor_wait``, ``timing_s/bank_wait``) can
        be 0 while the experience it reads is this many steps old."""
        with self._cond:
            if self._writes_done >= len(self._batch_steps):
                return 0
            return max(0, step - self._batch_steps[self._writes_done])

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"extractor track failed: {self._error}") from self._error

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=600)

    # -- the thread ----------------------------------------------------------------------------
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
                    self._writes_done = max(self._writes_done, self._done)
                    self._cond.notify_all()

    def _process(self, step: int, trajectories: list[Any]) -> None:
        self.log(self.extractor_step(self, step, trajectories))

    # -- the verbs -----------------------------------------------------------------------------
    def distil(self, step: int, trajectories: list[Any]) -> dict[str, Any]:
        """Each trajectory -> at most ``max_ops`` bank operations, written at once; each call is an
        extractor sample, kept while its entries may still be credited (a malformed one: -1)."""
        from crl_bench.extractor.extraction import (build_extraction_messages, episode_actions,
                                                     parse_operations, parse_operations_official,
                                                     trajectory_pairs, trajectory_to_text)

        t0 = time.perf_counter()
        messages, metas = [], []
        if self.cfg.distill == "with_experience":
            # official: only the with-experience half updates the bank
            # (memory_integration_mixin.py `_should_update_trajectory_memory`)
            kept = [t for t in trajectories if t.with_experience]
            self.stats["not_distilled"] += len(trajectories) - len(kept)
            trajectories = kept
        keep_reasoning = self.cfg.keep_reasoning
        for traj in trajectories:
            retrieved = self.manager.bank.get(list(traj.experience_ids)) if traj.experience_ids else []
            # each turn after the observation it answered; the last observation after it
            pairs, final = trajectory_pairs(traj, keep_reasoning)
            text = trajectory_to_text(pairs, max_chars=self.cfg.max_trajectory_chars,
                                      final_observation=final)
            outcome = {"success": traj.success, "score": traj.score, "n_actions": traj.n_actions}
            msgs = build_extraction_messages(traj.goal, text, outcome, retrieved,
                                             style=self.cfg.extraction_style)
            prefill = ""
            if self.template is not None:
                prefill = self.template.prefill(traj.goal, bool(traj.success), episode_actions(traj))
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
                answer = (gen.text if self.template is None
                          else self.template.answer(prefill, gen.text, episode_actions(traj)))
                if self.cfg.extraction_style == "official":  # caps nothing, return ends the list
                    ops, malformed = parse_operations_official(answer, retrieved_ids)
                else:
                    ops, malformed = parse_operations(answer, valid_target_ids=retrieved_ids,
                                                      max_ops=self.cfg.max_ops)
                written: list[int] = []
                if not malformed and ops:
                    key = traj.meta.get("query") if self.key_by_episode_start else None
                    written = self.manager.apply_operations(
                        ops, family=traj.meta.get("family", ""), task_id=traj.task_id,
                        provenance={"run": self.run_name,
                                    "trajectories": [f"{traj.task_name}/seed{traj.seed}/group{traj.group_id}"]},
                        step=step, key_text=key,
                        update_mode=self.cfg.update_mode,
                        allow_empty=self.cfg.extraction_style == "official")
                sample = ExtractorSample(list(gen.prompt_ids), list(gen.completion_ids), list(gen.logprobs),
                                         kind="extract", created_step=step, malformed=malformed,
                                         entry_ids=[int(i) for i in written])
                self._register(sample)
                new_samples.append(sample)
                self.stats["extractions"] += 1
                self.stats["malformed"] += int(malformed)
                self.stats["ops_applied"] += len(written)
            train_malformed = self.cfg.train_malformed
            for s in new_samples:
                if s.entry_ids or (s.malformed and train_malformed):
                    self.samples.append(s)
                    if s.malformed:  # its reward (-1) is known now
                        self.policy.credited(self, s)
                    for eid in s.entry_ids:
                        self._entry_to_samples.setdefault(eid, []).append(s)
            self._pending = [(st, tr) for st, tr in self._pending if st != step]
        return {"step": step, "extractor/extract_s": time.perf_counter() - t0,
                "extractor/malformed_frac": sum(s.malformed for s in new_samples)
                / max(1, len(new_samples))}

    def merge_due(self, step: int) -> bool:
        """Whether ``merge_every`` steps have passed since the last merge (never when 0)."""
        return bool(self.merge_every) and step - self.last_merge_step >= self.merge_every

    def merge_in_step(self, step: int) -> bool:
        """Whether the extractor's own step merges now: due, and not fenced (official fencing
        merges only inside the actor's pre-rollout flush, see :attr:`fence_merges`)."""
        return self.merge_due(step) and not self.fence_merges

    @property
    def training(self) -> bool:
        """An extractor update is running (official ``_has_pending_memory_train``)."""
        return self._training_now

    def merge(self, step: int) -> dict[str, Any]:
        """Consolidate the bank (:func:`~crl_bench.extractor.merge.merge_bank`); with
        ``extractor.train_merges`` the merge calls become extractor samples."""
        from crl_bench.extractor.merge import ActionItemTemplate, ItemTemplate, merge_bank

        t1 = time.perf_counter()
        items = self.cfg.merge_format == "items"  # small models: the item template
        template: ItemTemplate | None = None
        if items and self.cfg.answer_template == "action":
            template = ActionItemTemplate()
        elif items and self.template:
            template = ItemTemplate(one_sentence=self.cfg.answer_template == "sentence")
        result = merge_bank(self.manager, self.generate, step=step, chunk=self.merge_chunk,
                            fmt=self.cfg.merge_format, template=template, scope=self.merge_scope,
                            style=self.cfg.merge_style)
        self.last_merge_step = step
        self.stats["merges"] += 1
        metrics: dict[str, Any] = {"extractor/merge_s": time.perf_counter() - t1}
        metrics.update({f"bank/merge_{k}": v for k, v in _merge_counts(result).items()})
        if self.cfg.train_merges:
            self._add_merge_samples(result, step)
        return metrics

    def writes_done(self) -> None:
        """This batch's bank writes are done: a rollout waiting for them (``wait_writes``) may start."""
        with self._cond:
            self._writes_done += 1
            self._cond.notify_all()

    def _add_merge_samples(self, result: Any, step: int) -> None:
        """Merge calls become extractor samples, credited like adds: by the use of the entries
        they created (official: merge calls are trained). A malformed merge is a malformed
        sample; a window that changed nothing (keep / stale) creates nothing to credit."""
        train_malformed = self.cfg.train_malformed
        samples = list(result.samples)
        if self.cfg.merge_style == "official":
            samples = _last_call_per_scope(samples, self.manager)
        with self._state_lock:
            for ms in samples:
                gen = ms.generation
                if not hasattr(gen, "completion_ids"):
                    continue
                sample = ExtractorSample(list(gen.prompt_ids), list(gen.completion_ids),
                                         list(gen.logprobs), kind="merge", created_step=step,
                                         malformed=bool(ms.malformed),
                                         entry_ids=[int(i) for i in ms.created_ids])
                self._register(sample)
                if sample.entry_ids or (sample.malformed and train_malformed):
                    self.samples.append(sample)
                    for eid in sample.entry_ids:
                        self._entry_to_samples.setdefault(eid, []).append(sample)

    def train(self, step: int, *, count_aware: bool = True) -> dict[str, Any]:
        """One CISPO update on the samples the sample policy hands over (none yet: only the
        pool's figures): advantage ``r - mean r`` times the count-aware weight
        ``(1 + n_trained)^-power``, 0 inside the cooldown (``count_aware=False``, or
        ``extractor.count_reweight`` off: weight 1). :attr:`training` is up while it runs."""
        with self._state_lock:
            out, ready, usage = self.policy.take(self, step, self.trainer is not None)
        if not ready:
            return out
        self._training_now = True
        self._uncollected = True  # until the actor loop's next flush decision collects it
        try:
            return self._train_batch(step, ready, usage, out, count_aware=count_aware)
        finally:
            self._training_now = False

    def update_pending(self) -> bool:
        """An extractor update was launched and the actor loop has not collected it yet
        (official ``_has_pending_memory_train``, ``pipeline.py:1603-1604``: set at the launch,
        :1690, cleared only by ``_maybe_finish_pending_memory_train`` at :1274, after the step's
        flush decision at :1237, and only once the update has finished). A method, not a
        property, so that it also answers through the Ray track's call forwarding."""
        return self._training_now or self._uncollected

    def collect_update(self) -> bool:
        """The actor loop, after its flush decision: a finished update is collected (True when
        one was); a running one stays pending."""
        if self._training_now or not self._uncollected:
            return False
        self._uncollected = False
        return True

    def merged_at(self, step: int) -> bool:
        """A merge pass already ran at actor step ``step``."""
        return self.last_merge_step == step

    def merge_period(self) -> int:
        """``merge_every`` (0: this track never merges). Callers outside the track read it here,
        not as the attribute: through the Ray track's call forwarding an attribute read is a
        bound method, always true."""
        return int(self.merge_every)

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to the run total ``stats[key]`` (logged as ``extractor/<key>``); through the
        Ray track's forwarding ``stats`` is a copy, so callers outside the track count here."""
        self.stats[key] = self.stats.get(key, 0) + n

    def _train_batch(self, step: int, ready: list[ExtractorSample], usage: list[list[float]],
                     out: dict[str, Any], *, count_aware: bool) -> dict[str, Any]:
        import torch

        from crl_bench.algorithms.credit import (count_aware_weights, extractor_advantages,
                                                 extractor_rewards)

        rewards = extractor_rewards(usage, [s.malformed for s in ready])
        adv = extractor_advantages(rewards)
        if count_aware and self.cfg.count_reweight:  # as launched: off (docs/fidelity.md 1c)
            weights = count_aware_weights(torch.tensor([s.times_trained for s in ready]),
                                          torch.tensor([s.last_trained_step for s in ready]), self.updates,
                                          power=self.cfg.count_power, cooldown=self.cfg.cooldown)
        else:
            weights = torch.ones(len(ready))
        batch = [TrainSample(s.prompt_ids, s.completion_ids, s.logprobs, float(a), float(w))
                 for s, a, w in zip(ready, adv.tolist(), weights.tolist())]
        m = self.trainer.update(batch, loss=self.cfg.loss, loss_kwargs=self.cfg.loss_kwargs(),
                                agg=self.cfg.agg, temperature=self.temperature)
        trained_entries: list[int] = []
        with self._state_lock:
            for s, w in zip(ready, weights.tolist()):
                if w > 0:
                    s.times_trained += 1
                    s.last_trained_step = self.updates
                    trained_entries.extend(s.entry_ids)
        if trained_entries:  # the bank's own count, for `crl-bench bank` and the report
            self.manager.mark_trained(sorted(set(trained_entries)), step)
        self.updates += 1
        release_free_memory()
        out.update({f"losses/extractor_{k}": v for k, v in m.items()})
        out["extractor/reward_mean"] = float(rewards.mean())
        out["extractor/updates"] = self.updates
        out["extractor/batch"] = len(ready)
        with self._state_lock:
            self.policy.trained(self)
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self, also: Callable[[], Any] | None = None) -> dict[str, Any]:
        """The pool, counters and unprocessed batches; ``also()`` (e.g. a bank backup) runs
        under the same lock, so the two agree: no batch half applied to the bank."""
        with self._state_lock:
            if also is not None:
                also()
            return {"samples": [s.to_json() for s in self.samples], "updates": self.updates,
                    **self.policy.state_dict(),
                    "last_merge_step": self.last_merge_step, "stats": dict(self.stats),
                    "pending": list(self._pending), "update_uncollected": self._uncollected}

    def load_state(self, state: dict[str, Any], trajectory_cls: Any) -> list[tuple[int, list[Any]]]:
        """Restore the pool; returns the unprocessed batches (to resubmit)."""
        with self._state_lock:
            self.samples = [ExtractorSample(**s) for s in state["samples"]]
            self.index_samples()
            by_uid = {s.uid: s for s in self.samples if s.uid >= 0}
            self.policy.load_state_dict(state, by_uid)
            self._uids = itertools.count(max(by_uid, default=-1) + 1)
            self.updates = int(state["updates"])
            self.last_merge_step = int(state["last_merge_step"])
            self._uncollected = bool(state.get("update_uncollected", False))
            self.stats.update(state["stats"])
        return [(st, [trajectory_cls.from_json(t) for t in trs]) for st, trs in state.get("pending", [])]


def _last_call_per_scope(samples: list[Any], manager: Any) -> list[Any]:
    """Official merge credit: one trained sample per scope and pass, its last call that changed
    the bank, credited by every entry the pass left in that scope (each new entry carries that
    call as its ``triggered_interaction``, ``async_memory_manager.py:2566``, :2600);
    malformed calls are never kept (they produce no ``lm_output`` to keep)."""
    import dataclasses

    by_scope: dict[tuple[str, Any], list[Any]] = {}
    for s in samples:
        by_scope.setdefault((s.family, s.key_group), []).append(s)
    out = []
    for group in by_scope.values():
        done = [s for s in group if s.created_ids and not s.malformed]
        if not done:
            continue
        created = [i for s in group for i in s.created_ids]
        alive = {e.id for e in manager.bank.get(created)}
        out.append(dataclasses.replace(done[-1], created_ids=[i for i in created if i in alive]))
    return out


def _merge_counts(result: Any) -> dict[str, float]:
    """One merge pass's counts (``bank/merge_<key>``; the cumulative windows and malformed
    windows come from the manager's counters)."""
    return {"merged": float(result.merged), "rewritten": float(result.rewritten),
            "discarded": float(result.discarded), "scopes": float(result.n_scopes),
            "added": float(len(result.created_ids)), "deleted": float(len(result.deleted_ids)),
            "size_after": float(result.size_after)}
