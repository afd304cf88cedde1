"""A live progress line for a run: phase, episodes done of total, tokens/s and ETA.

One :class:`ProgressReporter` per run. The loop and the :class:`~crl_bench.run.context.RunContext`
tell it what is happening (``set_phase``, ``begin_play``, ``step_done``); the rollout engine calls
``on_play_progress`` after every batched turn. A daemon thread prints the line:

* on a terminal: one line rewritten in place about every second;
* otherwise (a log file, a pipe, CI): a plain line every ``every_s`` seconds (default 10,
  ``CRL_PROGRESS_EVERY`` overrides it), and one at each phase change.

Example (non-terminal)::

    [progress 00:04:10] step 1/3 | playing 6/12 ep | run 30/84 episodes | 31.2 tok/s | ETA 21m05s

The ETA is the episodes still to play at the run's measured play rate (time per episode, partial
episodes counted by the turns they played), plus the measured non-play time (actor update,
extractor wait) per remaining step; before a step has finished, that second part is unknown and
the ETA is shown as a lower bound (``ETA >=``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class ProgressReporter:
    """Prints a progress line (see the module docstring). Thread-safe; ``close`` stops it."""

    def __init__(self, *, label: str = "", stream: TextIO | None = None, every_s: float | None = None,
                 enabled: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        env = os.environ.get("CRL_PROGRESS_EVERY")
        self.every_s = float(env) if env else (every_s if every_s is not None else 10.0)
        self.enabled = enabled
        self.label = label
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self.phase = "starting"
        self.step = 0
        self.total_steps = 0
        # the run's plan (set by ``plan_run``)
        self.episodes_total = 0
        self._episodes_finished = 0          # episodes of plays that have ended
        # the current play
        self._play_n = 0
        self._play_frac = 0.0
        self._play_done = 0
        self._play_t0: float | None = None
        self._play_tokens = 0
        self._play_s = 0.0                   # time in finished plays
        self._tokens = 0                     # tokens generated in finished plays
        self._play_s_this_step = 0.0
        self._overhead: list[float] = []     # non-play seconds of each finished train step
        self._steps_left = 0
        self.extra = ""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_print = 0.0
        self._width = 0

    # -- what the run tells it -------------------------------------------------------------
    def plan_run(self, *, total_steps: int, start_step: int, train_episodes_per_step: int,
                 eval_episodes: int, eval_steps: list[int]) -> None:
        """The work ahead: steps ``start_step+1..total_steps`` of ``train_episodes_per_step``
        episodes, and an evaluation of ``eval_episodes`` at each step in ``eval_steps``."""
        with self._lock:
            self.total_steps = total_steps
            self.step = start_step
            self._steps_left = total_steps - start_step
            self.episodes_total = (self._episodes_finished
                                   + train_episodes_per_step * (total_steps - start_step)
                                   + eval_episodes * len(eval_steps))

    def set_phase(self, phase: str, step: int | None = None) -> None:
        with self._lock:
            changed = phase != self.phase
            self.phase = phase
            if step is not None:
                self.step = step
        if changed and not self.tty:
            self.emit()

    def begin_play(self, phase: str, n_episodes: int) -> None:
        """A play of ``n_episodes`` concurrent episodes starts (``phase``: evaluating/playing)."""
        with self._lock:
            self._play_n, self._play_frac, self._play_done, self._play_tokens = n_episodes, 0.0, 0, 0
            self._play_t0 = time.perf_counter()
        self.set_phase(phase)

    def on_play_progress(self, stats: dict[str, Any]) -> None:
        """The rollout engine's per-turn callback: ``episodes_done``, ``episodes``,
        ``turns``, ``turns_max`` (played turns and the most the episodes may play), ``tokens``."""
        with self._lock:
            n = max(1, int(stats.get("episodes", self._play_n) or 1))
            self._play_n = n
            self._play_done = int(stats.get("episodes_done", 0))
            tmax = float(stats.get("turns_max", 0) or 0)
            self._play_frac = (float(stats.get("turns", 0)) / tmax) if tmax > 0 else self._play_done / n
            self._play_frac = min(1.0, max(self._play_frac, self._play_done / n))
            self._play_tokens = int(stats.get("tokens", 0))

    def end_play(self) -> None:
        with self._lock:
            if self._play_t0 is not None:
                dt = time.perf_counter() - self._play_t0
                self._play_s += dt
                self._play_s_this_step += dt
            self._episodes_finished += self._play_n
            self._tokens += self._play_tokens
            self._play_n, self._play_frac, self._play_done, self._play_tokens = 0, 0.0, 0, 0
            self._play_t0 = None

    def step_started(self, step: int) -> None:
        with self._lock:
            self.step = step
            self._play_s_this_step = 0.0
            self._step_t0 = time.perf_counter()

    def step_done(self, step: int) -> None:
        """A training step ended: its time outside plays is the per-step overhead."""
        with self._lock:
            wall = time.perf_counter() - getattr(self, "_step_t0", time.perf_counter())
            self._overhead.append(max(0.0, wall - self._play_s_this_step))
            self._steps_left = max(0, self.total_steps - step)

    # -- the line --------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            now = time.perf_counter()
            play_now = (now - self._play_t0) if self._play_t0 is not None else 0.0
            done_equiv = self._episodes_finished + self._play_frac * self._play_n
            play_s = self._play_s + play_now
            tokens = self._tokens + self._play_tokens
            rate = tokens / play_s if play_s > 0 else 0.0
            eta: float | None = None
            lower_bound = False
            if done_equiv > 0 and self.episodes_total:
                eta = (self.episodes_total - done_equiv) * play_s / done_equiv
                if self._overhead:
                    eta += self._steps_left * sum(self._overhead) / len(self._overhead)
                elif self._steps_left:
                    lower_bound = True
            return {"elapsed_s": now - self._t0, "phase": self.phase, "step": self.step,
                    "total_steps": self.total_steps, "play_done": self._play_done,
                    "play_n": self._play_n,
                    "episodes_done": self._episodes_finished + self._play_done,
                    "episodes_total": self.episodes_total, "tokens_per_s": rate, "eta_s": eta,
                    "eta_lower_bound": lower_bound, "extra": self.extra}

    def line(self) -> str:
        s = self.snapshot()
        parts = [f"[progress {_fmt_duration(s['elapsed_s'])}]" if not self.label
                 else f"[{self.label} {_fmt_duration(s['elapsed_s'])}]"]
        if s["total_steps"]:
            parts.append(f"step {s['step']}/{s['total_steps']}")
        phase = s["phase"]
        if s["play_n"]:
            phase += f" {s['play_done']}/{s['play_n']} ep"
        parts.append(phase)
        if s["episodes_total"]:
            parts.append(f"run {s['episodes_done']}/{s['episodes_total']} episodes")
        parts.append(f"{s['tokens_per_s']:.1f} tok/s")
        if s["eta_s"] is None:
            parts.append("ETA ?")
        else:
            parts.append(f"ETA {'>=' if s['eta_lower_bound'] else ''}{_fmt_duration(s['eta_s'])}")
        if s["extra"]:
            parts.append(s["extra"])
        return " | ".join(parts)

    def emit(self) -> None:
        if not self.enabled:
            return
        text = self.line()
        try:
            if self.tty:
                pad = max(0, self._width - len(text))
                self.stream.write("\r" + text + " " * pad)
                self._width = len(text)
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream must not kill the run
            return
        self._last_print = time.perf_counter()

    # -- the printing thread -----------------------------------------------------------------
    def start(self) -> "ProgressReporter":
        if not self.enabled or self._thread is not None:
            return self
        self.emit()
        period = 1.0 if self.tty else self.every_s

        def loop() -> None:
            while not self._stop.wait(min(period, 1.0)):
                if time.perf_counter() - self._last_print >= period:
                    self.emit()

        self._thread = threading.Thread(target=loop, name="crl-progress", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        if self.enabled and self.tty:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass


class NullProgress(ProgressReporter):
    """Does nothing (``--no-progress``)."""

    def __init__(self) -> None:
        super().__init__(enabled=False)
