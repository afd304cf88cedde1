"""The ExperienceManager: the one hub between rollout workers (retrieval) and the extractor track
(operations, merges).

- Reads share, writes exclude (readers-writer lock around every bank access).
- Retrieval is micro-batched across calling threads: the first waiting caller collects queries
  for up to ``batch_wait_ms`` or until ``batch_size`` queries are waiting, embeds them in one
  forward pass and searches them in one ANN call; the other callers sleep until their results
  are in.
- Retrieval diversification (see ``diversified_order``) keeps one popular entry from being
  handed to every episode, and usage is counted as entries are handed out.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from crl_bench.experience.bank import (
    ExperienceBank, ExperienceEntry, render_entry_text)
from crl_bench.experience.embedder import Embedder
from crl_bench.experience.locks import RWLock
from crl_bench.experience.retrieval import RetrievalSettings

Generate = Callable[[list[list[dict[str, str]]]], Sequence[Any]]
OpKind = Literal["add", "update", "return", "upvote", "downvote"]


@dataclass
class Operation:
    """One bank operation proposed by the extractor (parsed by ``crl_bench.extractor``)."""

    kind: OpKind
    title: str = ""
    content: str = ""
    target_ids: list[int] = field(default_factory=list)


@dataclass
class RetrievalConfig(RetrievalSettings):
    """How entries are retrieved: a run's :class:`~crl_bench.experience.retrieval.
    RetrievalSettings` (defaults, ranges, checks) plus what the run sets itself."""

    diversify: bool = True
    """Re-rank candidates by rank, usage count and recency (False = plain cosine top-k; the
    agent's ``method.diversify``)."""
    seed: int = 0
    """Seed of the random demotion (the run's seed)."""

    @classmethod
    def of(cls, settings: RetrievalSettings, **run: Any) -> "RetrievalConfig":
        """``settings`` whole, with the run's own values (``diversify``, ``seed``)."""
        values = {f.name: getattr(settings, f.name) for f in fields(RetrievalSettings)}
        return cls(**values, **run)


def retrieval_query(family: str, goal: str, observation: str, style: str = "goal_observation",
                    raw_obs: Any = None) -> str:
    """The text an episode start retrieves with.

    ``"goal_observation"``: goal + first observation (cut at 2,000 characters) for every family.
    ``"family"``: the form the family registered with its envs (``register_env(...,
    retrieval_query=...)`` in ``envs/<family>/registration.py``: the ``build_memory_query`` of
    the official env manager it is launched with, never cut); a family that registered none is
    queried with ``"Goal: {goal}\nObservation: {obs}"``
    (:func:`crl_bench.registry.goal_observation_query`). ``raw_obs``: the env's
    ``info["raw_obs"]`` at reset (MiniHack's NLE observation), or None.
    """
    if style == "goal_observation":
        return f"{goal}\n{observation}"[:2000]
    if style != "family":
        raise ValueError(f"query style must be 'goal_observation' or 'family', got {style!r}")
    from crl_bench.registry import family_retrieval_query

    return family_retrieval_query(family)(goal, observation, raw_obs)


def diversified_order(candidates: Sequence[tuple[int, float]], times_retrieved: Mapping[int, int],
                      last_retrieved: Mapping[int, float | None], now: float,
                      cfg: RetrievalConfig, rng: random.Random) -> list[int]:
    """Re-rank retrieval candidates so that popular and just-used entries give way.

    Candidates are ranked by similarity (rank r = 0 for the most similar); each gets
    ``score = -r - lam * ln(1 + times_retrieved) - 1[now - last_retrieved < recent_s]`` and the
    ids are returned by descending score (ties keep the similarity order). If the first one was
    retrieved recently, with probability ``drop_recent_top1_p`` it is moved to the end. With
    ``cfg.diversify`` off, the plain similarity order is returned.

    Args:
        candidates: (entry id, cosine similarity), any order.
        times_retrieved / last_retrieved: usage per id (missing = never; times in Unix seconds).
        now: current Unix time (seconds).
        rng: source of the random demotion (``rng.random()`` is drawn only when the top-1 is
            recent).
    """
    ordered = sorted(candidates, key=lambda c: -c[1])
    if not cfg.diversify or not ordered:
        return [eid for eid, _ in ordered]
    scored = []
    for rank, (eid, _) in enumerate(ordered):
        last = last_retrieved.get(eid)
        recent = last is not None and now - last < cfg.recent_s
        score = -rank - cfg.lam * math.log1p(times_retrieved.get(eid, 0)) - (1.0 if recent else 0.0)
        scored.append((score, rank, eid, recent))
    scored.sort(key=lambda s: (-s[0], s[1]))
    order = [s[2] for s in scored]
    if len(order) > 1 and scored[0][3] and rng.random() < cfg.drop_recent_top1_p:
        order = order[1:] + order[:1]
    return order


def step_clock(step_of: Callable[[], int], step_s: float,
               origin: float | Callable[[], float] = 0.0) -> Callable[[], float]:
    """A logical clock for :class:`ExperienceManager`: ``origin + step_of() * step_s`` seconds.

    A run passes its current actor step (``RunContext.step``) and the bank's creation time as
    ``origin`` (so stored ``last_retrieved`` values still read as dates; a function is asked at
    every reading, so that a bank restored from a checkpoint brings its own). Recency decisions
    then depend only on step differences, never on how long a step took on this machine, and a
    resumed run (which restores the step) takes the same decisions as the uninterrupted run.
    """
    if not (step_s > 0 and math.isfinite(step_s)):
        raise ValueError(f"step_s must be a finite number > 0, got {step_s}")
    origin_of = origin if callable(origin) else (lambda: origin)

    def now() -> float:
        return float(origin_of()) + int(step_of()) * float(step_s)
    return now


# counters that are cumulative over a run (checkpointed by ExperienceManager.state)
_CUMULATIVE = ("retrieve_calls", "queries", "batches", "entries_returned", "empty_results",
               "query_cache_hits", "ops_add", "ops_update", "ops_update_as_add", "ops_return",
               "merges", "merge_windows", "merge_malformed")


@dataclass
class _Request:
    queries: list[str]
    k: int
    family: str | None
    taken: bool = False
    done: bool = False
    result: list[list[ExperienceEntry]] | None = None
    error: BaseException | None = None


@dataclass
class _Counters:
    retrieve_calls: int = 0
    queries: int = 0
    batches: int = 0
    entries_returned: int = 0
    empty_results: int = 0
    query_cache_hits: int = 0
    ops_add: int = 0
    ops_update: int = 0
    ops_update_as_add: int = 0
    ops_return: int = 0
    merges: int = 0
    merge_windows: int = 0
    merge_malformed: int = 0
    batch_latency_s: deque = field(default_factory=lambda: deque(maxlen=2048))


class ExperienceManager:
    """The hub the rollout engine and the extractor track share (thread-safe).

    Args:
        bank: the ExperienceBank (its dim and embedder name must match ``embedder``).
        embedder: turns query and entry texts into vectors.
        retrieval: RetrievalConfig.
        clock: Unix-time source for "recently retrieved" (tests pass a fake clock).
    """

    def __init__(self, bank: ExperienceBank, embedder: Embedder,
                 retrieval: RetrievalConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if embedder.dim != bank.dim:
            raise ValueError(f"embedder {embedder.name!r} gives {embedder.dim}-dim vectors but the "
                             f"bank {bank.path} stores {bank.dim}-dim ones: use the bank's "
                             f"embedder ({bank.embedder_name or '?'}) or a new bank path")
        if bank.embedder_name and embedder.name != bank.embedder_name:
            raise ValueError(f"bank {bank.path} was built with embedder {bank.embedder_name!r}, "
                             f"not {embedder.name!r}: use that embedder or a new bank path")
        self.bank = bank
        self.embedder = embedder
        self.retrieval = retrieval or RetrievalConfig()
        self.clock = clock
        self._lock = RWLock()
        self._rng = random.Random(self.retrieval.seed)
        self._select_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: deque[_Request] = deque()
        self._pending_queries = 0
        self._collecting = False
        self._counters = _Counters()
        self._counter_lock = threading.Lock()
        self._votes: dict[int, int] = {}
        """Per entry, its vote count (official ``votes_count``; upvote / downvote operations)."""
        self._query_vecs: OrderedDict[str, np.ndarray] = OrderedDict()
        self._query_lock = threading.Lock()

    # ------------------------------------------------------------------ retrieval
    def retrieve(self, queries: list[str], k: int | None = None, family: str | None = None
                 ) -> list[list[ExperienceEntry]]:
        """Top-k entries (after diversification) per query text; thread-safe and micro-batched.

        Returns one list per query (shorter than k when the bank/family holds fewer entries).
        Each returned entry's ``times_retrieved`` / ``last_retrieved`` are counted at once (the
        returned objects show the values from before this retrieval).
        """
        if isinstance(queries, str):
            raise TypeError("retrieve() takes a list of query strings")
        if not queries:
            return []
        k = self.retrieval.k if k is None else k
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        req = _Request([str(q) for q in queries], k, family)
        cfg = self.retrieval
        with self._cond:
            self._pending.append(req)
            self._pending_queries += len(req.queries)
            self._cond.notify_all()
        while True:
            with self._cond:
                while not req.done and (req.taken or self._collecting):
                    self._cond.wait()
                if req.done:
                    break
                self._collecting = True  # this thread collects the next batch
                batch: list[_Request] = []
                try:
                    deadline = time.monotonic() + cfg.batch_wait_ms / 1000.0
                    while self._pending_queries < cfg.batch_size:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                    n = 0
                    while self._pending and (not batch or
                                             n + len(self._pending[0].queries) <= cfg.batch_size):
                        r = self._pending.popleft()
                        r.taken = True
                        batch.append(r)
                        n += len(r.queries)
                    self._pending_queries -= n
                finally:  # even if interrupted: another caller must be able to collect
                    self._collecting = False
                    self._cond.notify_all()
            try:
                results = self._run_batch(batch)
                error: BaseException | None = None
            except BaseException as exc:  # every caller in the batch sees the error
                results, error = None, exc
            with self._cond:
                for j, r in enumerate(batch):
                    r.result = results[j] if results is not None else None
                    r.error = error
                    r.done = True
                self._cond.notify_all()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _run_batch(self, batch: list[_Request]) -> list[list[list[ExperienceEntry]]]:
        t0 = time.perf_counter()
        cfg = self.retrieval
        texts = [q for r in batch for q in r.queries]
        vecs = self._embed_queries(texts)
        now = self.clock()
        # (request index, query index, row in vecs) grouped by family
        by_family: dict[str | None, list[tuple[int, int, int]]] = {}
        row = 0
        for ri, r in enumerate(batch):
            for qi in range(len(r.queries)):
                by_family.setdefault(r.family, []).append((ri, qi, row))
                row += 1
        chosen: list[list[list[int]]] = [[[] for _ in r.queries] for r in batch]
        with self._lock.read():
            candidates: dict[tuple[int, int], list[tuple[int, float]]] = {}
            for fam, rows in by_family.items():
                kmax = max(batch[ri].k for ri, _, _ in rows)
                n_cand = kmax * cfg.oversample if cfg.diversify else kmax
                hits = self.bank.search(vecs[[r for _, _, r in rows]], n_cand, family=fam)
                for (ri, qi, _), h in zip(rows, hits):
                    candidates[(ri, qi)] = h
            with self._select_lock:
                ids = {i for hits in candidates.values() for i, _ in hits}
                times, last = self.bank.usage(ids)
                for (ri, qi), hits in candidates.items():
                    picked = diversified_order(hits, times, last, now, cfg, self._rng)[:batch[ri].k]
                    if cfg.usage_per == "pick":  # later queries of the batch see these uses
                        for i in picked:
                            times[i] = times.get(i, 0) + 1
                            last[i] = now
                    chosen[ri][qi] = picked
            flat = [i for per_req in chosen for per_q in per_req for i in per_q]
            entries = {e.id: e for e in self.bank.get(set(flat))}
            self.bank.record_retrievals(flat, now)
        out = [[[entries[i] for i in per_q if i in entries] for per_q in per_req]
               for per_req in chosen]
        with self._counter_lock:
            c = self._counters
            c.retrieve_calls += len(batch)
            c.queries += len(texts)
            c.batches += 1
            c.entries_returned += sum(len(x) for per_req in out for x in per_req)
            c.empty_results += sum(1 for per_req in out for x in per_req if not x)
            c.batch_latency_s.append(time.perf_counter() - t0)
        return out

    def _embed_queries(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dim]; repeated texts are embedded once (LRU cache)."""
        size = self.retrieval.query_cache
        with self._query_lock:
            cached = {t: self._query_vecs[t] for t in set(texts) if t in self._query_vecs}
            for t in cached:
                self._query_vecs.move_to_end(t)
        missing = [t for t in dict.fromkeys(texts) if t not in cached]
        if missing:
            fresh = self.embedder.encode(missing)
            cached.update(zip(missing, fresh))
            if size:
                with self._query_lock:
                    for t, v in zip(missing, fresh):
                        self._query_vecs[t] = v
                    while len(self._query_vecs) > size:
                        self._query_vecs.popitem(last=False)
        with self._counter_lock:
            self._counters.query_cache_hits += len(texts) - len(missing)
        return np.stack([cached[t] for t in texts]).astype(np.float32)

    # ------------------------------------------------------------------ extractor operations
    def apply_operations(self, ops: Sequence[Operation], *, family: str, task_id: str,
                         provenance: Mapping[str, Any], step: int, key_text: str | None = None,
                         update_mode: str = "in_place", allow_empty: bool = False) -> list[int]:
        """Apply the extractor's operations for one episode in ONE bank transaction.

        ``add`` stores a new entry of ``family``; ``update`` rewrites its first target in place
        (keeping its id and usage history) and folds the other targets into it (they are
        deleted); an update whose targets have all disappeared meanwhile (merged, evicted) is
        stored as an add; ``return`` does nothing.

        Args:
            provenance: ``{"run": str, "trajectories": list[str]}`` (both optional): the run name
                and the ids of the trajectories the entries were distilled from.
            key_text: embed every written entry by this text (the source episode's starting
                query: retrieval then matches episode starts, as the official
                ``use_memory_title_for_key: false``) instead of the entry's own text.
            update_mode: "in_place" (above) or "replace": an update deletes all its targets and
                adds a new entry (a new id, fresh usage counts), so that only the writer of the
                update is credited for it (official ``async_memory_manager.py``: a new uuid per
                updated memory).
            allow_empty: an ``add`` / ``update`` with an empty title or content is stored as it
                is (official: an empty memory text is stored, ``async_memory_manager.py:
                1873-1901``); else (default) it is refused.
        Returns:
            ids written (new entries, then updated ones).
        """
        if update_mode not in ("in_place", "replace"):
            raise ValueError(f"update_mode must be 'in_place' or 'replace', got {update_mode!r}")
        unknown = set(provenance) - {"run", "trajectories"}
        if unknown:
            raise ValueError(f"provenance keys must be 'run' and 'trajectories', got "
                             f"{sorted(unknown)}")
        run = str(provenance.get("run", ""))
        trajectories = [str(t) for t in provenance.get("trajectories", [])]
        writes = [op for op in ops if op.kind in ("add", "update")]
        for op in ops:
            if op.kind not in ("add", "update", "return", "upvote", "downvote"):
                raise ValueError(f"unknown operation kind {op.kind!r}")
            if (op.kind in ("add", "update") and not allow_empty
                    and (not op.title.strip() or not op.content.strip())):
                raise ValueError(f"{op.kind} operation needs a title and a content")
        with self._counter_lock:
            self._counters.ops_return += sum(op.kind == "return" for op in ops)
        votes = [op for op in ops if op.kind in ("upvote", "downvote")]
        if votes:
            self.apply_votes(votes)
        if not writes:
            return []
        if key_text is not None:
            vecs = np.repeat(self.embedder.encode([key_text]), len(writes), axis=0)
        else:
            vecs = self.embedder.encode([render_entry_text(op.title, op.content) for op in writes])
        adds: list[dict[str, Any]] = []
        add_vecs: list[np.ndarray] = []
        updates: list[tuple[int, dict[str, Any], np.ndarray]] = []
        deletes: list[int] = []
        n_update_as_add = 0
        with self._lock.write():
            targets = {e.id: e for e in self.bank.get(
                {t for op in writes for t in op.target_ids})}
            for op, vec in zip(writes, vecs):
                alive = [targets[t] for t in op.target_ids if t in targets]
                if op.kind == "add" or not alive:
                    n_update_as_add += op.kind == "update"
                    adds.append({"title": op.title, "content": op.content, "family": family,
                                 "task_ids": [task_id], "run": run,
                                 "source_trajectories": trajectories, "origin": "add"})
                    add_vecs.append(vec)
                    continue
                if update_mode == "replace":
                    adds.append({"title": op.title, "content": op.content, "family": family,
                                 "task_ids": _union(*(e.task_ids for e in alive), [task_id]),
                                 "run": run,
                                 "source_trajectories": _union(*(e.source_trajectories for e in alive),
                                                               trajectories),
                                 "parent_ids": [e.id for e in alive], "origin": "update"})
                    add_vecs.append(vec)
                    deletes.extend(e.id for e in alive)
                    continue
                primary, folded = alive[0], alive[1:]
                updates.append((primary.id, {
                    "title": op.title, "content": op.content,
                    "task_ids": _union(*(e.task_ids for e in alive), [task_id]),
                    "source_trajectories": _union(*(e.source_trajectories for e in alive),
                                                  trajectories),
                    "parent_ids": _union_ints(primary.parent_ids, [e.id for e in folded]),
                    "origin": "update"}, vec))
                deletes.extend(e.id for e in folded)
            result = self.bank.commit(
                adds=adds, add_embeddings=np.stack(add_vecs) if add_vecs else None,
                updates=updates, deletes=deletes, step=step, missing_ok=True,
                allow_empty_text=allow_empty)
        with self._counter_lock:
            self._counters.ops_add += sum(op.kind == "add" for op in writes)
            self._counters.ops_update += sum(op.kind == "update" for op in writes)
            self._counters.ops_update_as_add += n_update_as_add
        return result.added_ids + result.updated_ids

    def record_outcomes(self, entry_ids: Sequence[int], score: float) -> None:
        """A trajectory that used ``entry_ids`` finished with ``score``: each entry's n_used += 1
        and its outcome sum += (score if score > 0 else -1) (its mean is the extractor reward)."""
        from crl_bench.algorithms.credit import entry_outcome  # (torch: imported when used)

        self.bank.record_outcomes(entry_ids, entry_outcome(score))

    def mark_trained(self, entry_ids: Sequence[int], step: int) -> None:
        """The extractor samples behind ``entry_ids`` were used in an update at ``step`` (feeds
        the count-aware reweighting: times_trained, last_trained_step)."""
        self.bank.mark_trained(entry_ids, step)

    def apply_votes(self, votes: Sequence[Operation]) -> list[int]:
        """``upvote`` adds one to each target's vote count, ``downvote`` takes one off and
        deletes the entry when its count falls below 0 (official ``async_memory_manager.py:
        1796-1869``; a new entry starts at 0, :1876). Targets no longer in the bank are skipped.
        Returns the deleted ids."""
        with self._lock.write():
            alive = {e.id for e in self.bank.get({t for op in votes for t in op.target_ids})}
            drop: list[int] = []
            for op in votes:
                for t in op.target_ids:
                    if t not in alive or t in drop:
                        continue
                    count = self._votes.get(t, 0) + (1 if op.kind == "upvote" else -1)
                    if count < 0:
                        drop.append(t)
                        self._votes.pop(t, None)
                    else:
                        self._votes[t] = count
            if not drop:
                return []
            return self.bank.commit(deletes=drop, step=0, missing_ok=True).deleted_ids

    def votes(self, entry_id: int) -> int:
        """An entry's vote count (0 when never voted on)."""
        return self._votes.get(int(entry_id), 0)

    def delete(self, ids: Sequence[int]) -> list[int]:
        """Delete entries (e.g. ones a person or a filter judged harmful); returns the ids that
        existed and were deleted."""
        with self._lock.write():
            return self.bank.commit(deletes=list(ids), step=0, missing_ok=True).deleted_ids

    def get(self, ids: Sequence[int]) -> list[ExperienceEntry]:
        """Entries by id (missing ids skipped), read under the shared lock."""
        with self._lock.read():
            return self.bank.get(ids)

    # ------------------------------------------------------------------ merge support
    def read_lock(self) -> Any:
        """The shared (read) side of the bank lock, for walks over the bank (merge)."""
        return self._lock.read()

    def replace_if_unchanged(self, adds: list[dict[str, Any]], texts: list[str], deletes: list[int],
                             expect_versions: dict[int, int], step: int,
                             embeddings: np.ndarray | None = None) -> Any:
        """Add ``adds`` and delete ``deletes`` in one transaction, only if every deleted entry
        still has the expected version (``StaleEntriesError`` otherwise). The added entries are
        embedded from ``texts``, or stored with ``embeddings`` (float [len(adds), dim], e.g. the
        retrieval key their parents shared) when given."""
        if embeddings is not None:
            vecs = np.asarray(embeddings, dtype=np.float32)
            if vecs.shape != (len(adds), self.embedder.dim):
                raise ValueError(f"embeddings must have shape ({len(adds)}, {self.embedder.dim}), "
                                 f"got {vecs.shape}")
        else:
            vecs = self.embedder.encode(texts) if texts else None
        with self._lock.write():
            return self.bank.commit(adds=adds, add_embeddings=vecs, deletes=deletes, step=step,
                                    expect_versions=expect_versions)

    def count_merge(self, n_windows: int, n_malformed: int) -> None:
        with self._counter_lock:
            self._counters.merges += 1
            self._counters.merge_windows += n_windows
            self._counters.merge_malformed += n_malformed

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """What a checkpoint needs for a resumed run to retrieve as the uninterrupted one does
        (JSON-serialisable): the retrieval RNG, the cumulative counters (``bank/queries``,
        ``bank/ops_add``, ``bank/merges``, ..., and the bank's ``evicted_total``) and the texts
        of the query-embedding cache, oldest first (their vectors: :meth:`query_cache_vectors`).
        Take it together with the bank's backup (the loop does, under the extractor track's
        lock) so that both describe the same moment."""
        with self._select_lock:
            version, internal, gauss = self._rng.getstate()
        with self._counter_lock:
            counters = {k: int(getattr(self._counters, k)) for k in _CUMULATIVE}
        with self._query_lock:
            texts = list(self._query_vecs)
        return {"rng": [version, list(internal), gauss], "counters": counters,
                "evicted_total": int(self.bank.evicted_total), "query_cache": texts,
                "votes": {str(k): int(v) for k, v in self._votes.items()}}

    def query_cache_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim]: the cached embeddings of ``texts`` (from :meth:`state`)."""
        with self._query_lock:
            vecs = [self._query_vecs[t] for t in texts if t in self._query_vecs]
        if len(vecs) != len(texts):
            raise KeyError("query cache changed since state() was taken")
        return (np.stack(vecs).astype(np.float32) if vecs
                else np.zeros((0, self.bank.dim), dtype=np.float32))

    def load_state(self, state: Mapping[str, Any], cache_vectors: np.ndarray | None = None) -> None:
        """Restore what :meth:`state` returned (and the cache's vectors, same order; None: the
        cache starts empty). Counters not in ``state`` keep their values."""
        version, internal, gauss = state["rng"]
        with self._select_lock:
            self._rng.setstate((int(version), tuple(int(x) for x in internal), gauss))
        with self._counter_lock:
            for k, v in dict(state.get("counters", {})).items():
                if k in _CUMULATIVE:
                    setattr(self._counters, k, int(v))
        self.bank.evicted_total = int(state.get("evicted_total", self.bank.evicted_total))
        self._votes = {int(k): int(v) for k, v in dict(state.get("votes", {})).items()}
        texts = list(state.get("query_cache", []))
        with self._query_lock:
            self._query_vecs.clear()
            if cache_vectors is not None:
                if len(cache_vectors) != len(texts):
                    raise ValueError(f"{len(texts)} cached query texts but {len(cache_vectors)} "
                                     "vectors")
                for t, v in zip(texts, np.asarray(cache_vectors, dtype=np.float32)):
                    self._query_vecs[t] = v

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, float]:
        """Metrics under ``bank/...``: size, per-family size, retrieval counts, batch sizes and
        latency (p50/p99 over the last 2048 batches, seconds), operation counts."""
        with self._counter_lock:
            c = self._counters
            lat = np.asarray(c.batch_latency_s, dtype=np.float64)
            out: dict[str, float] = {
                "bank/size": float(len(self.bank)),
                "bank/evicted_total": float(self.bank.evicted_total),
                "bank/retrieve_calls": float(c.retrieve_calls),
                "bank/queries": float(c.queries),
                "bank/retrieval_batches": float(c.batches),
                "bank/mean_batch_queries": c.queries / c.batches if c.batches else 0.0,
                "bank/entries_returned": float(c.entries_returned),
                "bank/empty_results": float(c.empty_results),
                "bank/query_cache_hits": float(c.query_cache_hits),
                "bank/batch_latency_p50_s": float(np.percentile(lat, 50)) if lat.size else 0.0,
                "bank/batch_latency_p99_s": float(np.percentile(lat, 99)) if lat.size else 0.0,
                "bank/ops_add": float(c.ops_add),
                "bank/ops_update": float(c.ops_update),
                "bank/ops_update_as_add": float(c.ops_update_as_add),
                "bank/ops_return": float(c.ops_return),
                "bank/merges": float(c.merges),
                "bank/merge_windows": float(c.merge_windows),
                "bank/merge_malformed": float(c.merge_malformed),
            }
        for fam, n in self.bank.family_counts().items():
            out[f"bank/size_{fam}"] = float(n)
        return out


def generation_text(generation: Any) -> str:
    """The text of a generation object (``.text``, as the LLM backends return), or the string
    itself."""
    if isinstance(generation, str):
        return generation
    text = getattr(generation, "text", None)
    if not isinstance(text, str):
        raise TypeError(f"generate() must return objects with a .text string, got "
                        f"{type(generation).__name__}")
    return text


def _union(*lists: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(x for lst in lists for x in lst))


def _union_ints(*lists: Sequence[int]) -> list[int]:
    return list(dict.fromkeys(int(x) for lst in lists for x in lst))
