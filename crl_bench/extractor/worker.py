"""The process form of a role host (``extractor.runs: process``): the extractor's model and
trainer in an OS process of their own.

On one machine without GPUs the actor loop and the extractor otherwise share one model behind
one lock (:class:`~crl_bench.llm.roles.LockedBackend`): while the extractor distils,
merges or trains, the actor waits. :class:`ProcessHost` starts a child process (one torch
thread by default) that builds a :class:`~crl_bench.training.host.LocalHost` of the extractor
role from the main backend's keyword arguments (:func:`~crl_bench.training.host.backend_spec`:
model, roles, LoRA shape, dtype, device, seed: the same initial weights; the main backend's
extractor weights are pushed in after the start all the same) and serves its
:class:`~crl_bench.training.host.RoleHost` calls, one at a time: ``generate`` (the same tokens
and log-probs as in the main process for the same weights and sampling seed; without a seed the
child's own torch RNG draws, seeded with the run seed), ``update``, ``updates``, ``weights`` /
``load_weights``, ``state_dict`` / ``load_state_dict`` (with the child's RNG) and ``snapshot``
(weights, trainer state and RNG in one call: a checkpoint's consistent cut).

The extractor track (its thread, the bank writes, the credit, the checkpoints) stays in the
main process: only its model calls cross over.

Failure modes are errors, never hangs: an exception in the child is raised in the parent as
:class:`WorkerError` carrying the child's traceback; a child that exits (killed, out of memory)
is :class:`WorkerDied` at the next call or while a call waits (its liveness is checked every
second); a call may be given a timeout. The child never outlives the parent: it asks the
kernel for SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``) and a watchdog thread
exits when its parent process id changes (any platform).

The wire: two socket pairs; requests and answers are whole ``pickle`` payloads (tensors by
value, not torch's shared-memory reductions). Generation and updates go over the first, one at a
time; weights, state and snapshots over the second, served by a thread of their own in the
child, so that a checkpoint does not wait for a long distillation batch to finish (only for an
update in progress: the weights are read between optimizer steps, never during one). The child
is ``python -c`` on this module, not a ``multiprocessing`` spawn, so a parent's ``__main__`` is
never re-imported there.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

from crl_bench.training.host import ProcessHostServer

POLL_S = 1.0
"""How often a waiting call checks that the child still lives."""
START_TIMEOUT_S = 900.0
"""The child must have built its model within this many seconds."""


class WorkerError(RuntimeError):
    """A call raised in the extractor worker; the message ends with the child's traceback."""


class WorkerDied(RuntimeError):
    """The extractor worker's process is gone (or stopped answering within the call's timeout)."""


# ------------------------------------------------------------------------------- parent side
class ProcessHost:
    """The extractor role's host in a child process (see the module docstring): the parent's
    handle, a :class:`~crl_bench.training.host.RoleHost`.

    Args:
        backend_kind: the backend registry name ("hf", ...).
        spec: the backend's keyword arguments (:func:`~crl_bench.training.host.backend_spec`).
        sampling: the extractor's :class:`~crl_bench.llm.types.SamplingParams`.
        optim: the extractor's :class:`~crl_bench.config.schema.ExtractorConfig` (None: frozen,
            no trainer in the child).
        total_steps, trainer_seed: as for ``RoleTrainer``.
        rng_seed: the child's torch / python RNG seed.
        threads: torch threads in the child.
        start_timeout_s: the child must answer its first call within this.
    """

    def __init__(self, backend_kind: str, spec: dict[str, Any], sampling: Any, optim: Any = None,
                 *, total_steps: int = 1, trainer_seed: int = 0, rng_seed: int = 0,
                 threads: int = 1, start_timeout_s: float = START_TIMEOUT_S) -> None:
        from multiprocessing.connection import Connection

        self.role = "extractor"
        self.local = False  # its weights are a copy: a checkpoint brings them back first

        from crl_bench.llm.roles import WaitTimingLock

        ours, theirs = socket.socketpair()
        ours_ctl, theirs_ctl = socket.socketpair()
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        root = str(Path(__file__).resolve().parents[2])  # this checkout's crl_bench first
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        code = ("import sys; from crl_bench.extractor.worker import serve; "
                "serve(*map(int, sys.argv[1:]))")
        fds = (theirs.fileno(), theirs_ctl.fileno())
        self.proc = subprocess.Popen([sys.executable, "-c", code, *map(str, fds), str(os.getpid())],
                                     pass_fds=fds, env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        theirs_ctl.close()
        self._socks = (ours, ours_ctl)  # the Connections wrap dups of their fds; close both
        self._conn = Connection(os.dup(ours.fileno()))
        self._ctl = Connection(os.dup(ours_ctl.fileno()))
        self._ctl_lock = threading.Lock()
        self.lock = WaitTimingLock()
        """Serialises calls; the time a thread waited while another thread's call ran is kept
        per thread name (:meth:`take_wait`), as on the model lock of the one-process mode."""
        self._broken: str | None = None
        self.closed = False
        init = dict(backend_kind=backend_kind, spec=spec, sampling=sampling, optim=optim,
                    total_steps=total_steps, trainer_seed=trainer_seed, rng_seed=rng_seed,
                    threads=threads)
        try:
            self._call("__init__", (), init, timeout=start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    # the calls ---------------------------------------------------------------------------------
    def generate(self, message_lists: list[list[dict]], stop: Sequence[str] = (),
                 seed: int | None = None) -> list[Any]:
        """The extractor role on the child's model (``seed``: the sampling seed, None: the
        child's RNG)."""
        return self._call("generate", (message_lists, tuple(stop), seed))

    def update(self, samples: Sequence[Any], **kwargs: Any) -> dict[str, float]:
        return self._call("update", (list(samples),), kwargs)

    @property
    def updates(self) -> int:
        return int(self._call_ctl("updates"))

    def state_dict(self) -> dict[str, Any]:
        """The child trainer's state (``RoleTrainer.state_dict``) plus ``"worker_rng"``."""
        return self._call_ctl("state_dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call_ctl("load_state_dict", (state,))

    def weights(self) -> list[Any]:
        return self._call_ctl("weights")

    def load_weights(self, weights: Sequence[Any]) -> None:
        """Set the extractor's weights (at a start or a resume: a generation running meanwhile
        would see them change)."""
        self._call_ctl("load_weights", ([w.detach().cpu() for w in weights],))

    def snapshot(self) -> dict[str, Any]:
        """``{"weights": ..., "state": ...}`` in one call: no update lands between them."""
        return self._call_ctl("snapshot")

    def take_wait(self, name: str) -> float:
        return self.lock.take_wait(name)

    def close(self, timeout_s: float = 30.0) -> None:
        """Ask the child to exit; kill it if it does not within ``timeout_s``."""
        if self.closed:
            return
        self.closed = True
        if self.proc.poll() is None and self._broken is None:
            try:
                with self.lock:
                    self._send(self._conn, ("close", (), {}))
                    self._recv(self._conn, timeout_s, "close")
            except (WorkerDied, WorkerError, OSError):
                pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for closable in (self._conn, self._ctl, *self._socks):
            closable.close()

    def __del__(self) -> None:  # a forgotten worker is not left behind
        try:
            if not self.closed and self.proc.poll() is None:
                self.proc.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # the wire ----------------------------------------------------------------------------------
    def _call(self, method: str, args: tuple = (), kwargs: dict[str, Any] | None = None,
              timeout: float | None = None) -> Any:
        with self.lock:
            return self._exchange(self._conn, method, args, kwargs, timeout)

    def _call_ctl(self, method: str, args: tuple = (), kwargs: dict[str, Any] | None = None,
                  timeout: float | None = None) -> Any:
        with self._ctl_lock:
            return self._exchange(self._ctl, method, args, kwargs, timeout)

    def _exchange(self, conn: Any, method: str, args: tuple, kwargs: dict[str, Any] | None,
                  timeout: float | None) -> Any:
        if self.closed:
            raise WorkerDied("the extractor worker was closed")
        if self._broken is not None:
            raise WorkerDied(self._broken)
        self._send(conn, (method, args, kwargs or {}))
        status, payload = self._recv(conn, timeout, method)
        if status == "error":
            kind, message, tb = payload
            raise WorkerError(f"extractor worker (pid {self.pid}) failed in {method}(): "
                              f"{kind}: {message}\n--- the worker's traceback ---\n{tb}")
        return payload

    def _send(self, conn: Any, message: Any) -> None:
        try:
            conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            raise self._died(f"sending failed ({exc})") from None

    def _recv(self, conn: Any, timeout: float | None, method: str) -> tuple[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not conn.poll(POLL_S):
            if self.proc.poll() is not None:
                raise self._died(f"while {method}() ran")
            if deadline is not None and time.monotonic() > deadline:
                self.proc.kill()
                raise self._died(f"{method}() did not answer within {timeout:.0f} s; killed")
        try:
            return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            raise self._died(f"while {method}() ran") from None

    def _died(self, when: str) -> WorkerDied:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = ("still running" if code is None else f"killed by signal {-code}" if code < 0
               else f"exit code {code}")
        self._broken = (f"the extractor worker process (pid {self.pid}) is gone ({how}) {when}. "
                        "Its output above says why (out of memory: fewer threads or a smaller "
                        "extractor; or run it in the main process with --set extractor.runs=thread).")
        return WorkerDied(self._broken)


# -------------------------------------------------------------------------------- child side
class _Server(ProcessHostServer):
    """What the child holds: the extractor role's
    :class:`~crl_bench.training.host.ProcessHostServer` (its backend, trainer and sampling
    settings; the child's RNG in its state)."""

    def __init__(self, backend_kind: str, spec: dict[str, Any], sampling: Any, optim: Any,
                 total_steps: int, trainer_seed: int, rng_seed: int, threads: int) -> None:
        super().__init__(backend_kind, spec, "extractor", sampling, optim,
                         total_steps=total_steps, trainer_seed=trainer_seed, rng_seed=rng_seed,
                         threads=threads)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL from the kernel when the parent dies (Linux), and a watchdog for elsewhere."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before the request above
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(POLL_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


CONTROL_CALLS = frozenset({"updates", "state_dict", "load_state_dict", "weights", "load_weights",
                           "snapshot"})
"""What the second channel serves (weights and state; never generation or an update)."""


def _answer(server: "_Server | None", method: str, args: tuple, kwargs: dict[str, Any],
            allowed: frozenset[str] | None) -> bytes:
    """Run one request; the pickled ``("ok", result)`` or ``("error", (type, message, tb))``."""
    try:
        if server is None or method.startswith("_") or (allowed is not None and method not in allowed):
            raise RuntimeError(f"unknown or premature call {method!r}")
        reply = ("ok", getattr(server, method)(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        reply = ("error", (type(exc).__name__, str(exc), traceback.format_exc()))
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an answer that does not pickle
        return pickle.dumps(("error", (type(exc).__name__, f"the answer of {method}() could not "
                                       f"be sent: {exc}", traceback.format_exc())))


def _serve_control(conn: Any, server: "_Server") -> None:
    while True:
        try:
            method, args, kwargs = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        conn.send_bytes(_answer(server, method, args, kwargs, CONTROL_CALLS))


def serve(fd: int, ctl_fd: int, parent_pid: int) -> None:
    """The child's loop: one request at a time on the first channel until ``close`` or the
    parent's end closes; the second channel in a thread once the model is built."""
    from multiprocessing.connection import Connection

    _die_with_parent(parent_pid)
    conn = Connection(fd)
    server: _Server | None = None
    while True:
        try:
            method, args, kwargs = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if method == "close":
            conn.send_bytes(pickle.dumps(("ok", None)))
            return
        if method == "__init__" and server is None:
            try:
                server = _Server(**kwargs)
            except BaseException as exc:  # noqa: BLE001
                conn.send_bytes(pickle.dumps(("error", (type(exc).__name__, str(exc),
                                                        traceback.format_exc()))))
                continue
            threading.Thread(target=_serve_control, args=(Connection(ctl_fd), server),
                             name="control", daemon=True).start()
            conn.send_bytes(pickle.dumps(("ok", None)))
            continue
        conn.send_bytes(_answer(server, method, args, kwargs, None))
