"""``check_text_env``: gymnasium's ``check_env`` (no warnings allowed) plus text-specific checks.

The text checks:

* **fuzzed actions** — empty, 10,000 characters, control characters, ANSI escapes, lone
  surrogates, non-ASCII, valid-looking but unknown words, malformed brackets — must come back as
  feedback (an observation, a ``False`` ``action_valid``), never as an exception;
* **clean text** — every observation (and ``info["goal"]``, ``info["admissible_actions"]``)
  encodes as UTF-8 and holds no control character but ``\n``/``\t``: an env that echoes an
  action raw fails (see :func:`crl_bench.text_env.echo_text`);
* **bad options** — ``reset(options="notadict")`` raises ``TypeError``/``ValueError`` (not an
  ``AttributeError`` from deep inside);
* **episode end** — after a step returns ``terminated`` or ``truncated``, two more steps return
  reward 0, the same end flags and ``action_valid=False`` (the convention of
  :mod:`crl_bench.text_env`); an env that silently keeps stepping, or raises, fails;
* **close** — ``reset``/``step`` after ``close()`` either work or raise an error other than
  ``AttributeError``/``TypeError`` (checked only on envs made from an id);
* **determinism** — the same seed and the same actions give the same observations, rewards and
  flags;
* **info keys** — every key of :data:`crl_bench.text_env.INFO_KEYS` is present after ``reset``
  and after every ``step``, with the documented types.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from crl_bench.text_env import INFO_KEYS, is_safe_text

FUZZ_ACTIONS: tuple[str, ...] = (
    "",
    "   ",
    "x" * 10_000,
    "north\x00\x07\x1b[31m\r\n",
    "\t\n\x0b\x0c",
    "nörd 北 🚀 ΩΩΩ",
    "flibbertigibbet the wumpus",
    "search[",
    "click[]]",
    "]]][[[",
    "<answer></answer>",
    "go north " * 50,
    "click[\ud800]",
    "search[\udcff lamp]",
    "\ud83d",
    "look\x1b[2J\x1b[31mred\x1b[0m",
    "\x7f\x85\x9b[1m",
    "click[" + "y" * 5_000 + "]",
)
# the action used to run an episode to its end (invalid everywhere, so it only uses up steps)
END_ACTION = "zzz-not-an-action"
MAX_STEPS_TO_END = 500


class TextEnvCheckError(AssertionError):
    """A text env broke the contract; the message says which check and how."""


@dataclass
class CheckReport:
    env_id: str
    checks: list[str] = field(default_factory=list)

    def ok(self, what: str) -> None:
        self.checks.append(what)


def _check_info(info: Any, where: str) -> None:
    if not isinstance(info, dict):
        raise TextEnvCheckError(f"{where}: info must be a dict, got {type(info).__name__}")
    missing = [k for k in INFO_KEYS if k not in info]
    if missing:
        raise TextEnvCheckError(f"{where}: info lacks the documented keys {missing}. Build it with "
                                "TextEnv.make_info(...).")
    if not isinstance(info["goal"], str):
        raise TextEnvCheckError(f"{where}: info['goal'] must be str")
    aa = info["admissible_actions"]
    if aa is not None and not (isinstance(aa, list) and all(isinstance(a, str) for a in aa)):
        raise TextEnvCheckError(f"{where}: info['admissible_actions'] must be a list of str or None")
    if not isinstance(info["success"], bool):
        raise TextEnvCheckError(f"{where}: info['success'] must be bool")
    if not isinstance(info["score"], float) or not 0.0 <= info["score"] <= 1.0:
        raise TextEnvCheckError(f"{where}: info['score'] must be a float in [0, 1], got {info['score']!r}")
    if not isinstance(info["action_valid"], bool):
        raise TextEnvCheckError(f"{where}: info['action_valid'] must be bool")
    if not isinstance(info["task_id"], str):
        raise TextEnvCheckError(f"{where}: info['task_id'] must be str")


def _admissible(action: str, admissible: list[str]) -> bool:
    """``action`` is listed, or fills a listed template such as ``search[<query>]``."""
    if action in admissible:
        return True
    text = action.strip().lower()
    for entry in admissible:
        at = entry.find("[<")
        if at > 0 and entry.endswith(">]") and text.startswith(entry[:at + 1].lower()) \
                and text.endswith("]"):
            return True
    return False


def _check_clean(obs: str, info: dict[str, Any], where: str) -> None:
    if not is_safe_text(obs):
        try:
            obs.encode("utf-8")
            why = "holds control characters (ANSI escapes, \\r, \\x00, ...)"
        except UnicodeEncodeError:
            why = "is not valid UTF-8 (a lone surrogate)"
        raise TextEnvCheckError(
            f"{where}: the observation {why}: {obs[:80]!r}. Quote caller text with "
            "crl_bench.text_env.echo_text and pass observations through safe_text.")
    texts = [info["goal"], *(info["admissible_actions"] or [])]
    bad = [t for t in texts if not is_safe_text(t)]
    if bad:
        raise TextEnvCheckError(f"{where}: info text is not clean UTF-8 without control "
                                f"characters: {bad[0][:80]!r}")


def _check_step_result(result: Any, where: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    if not (isinstance(result, tuple) and len(result) == 5):
        raise TextEnvCheckError(f"{where}: step must return a 5-tuple "
                                "(observation, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = result
    if not isinstance(obs, str):
        raise TextEnvCheckError(f"{where}: observation must be str, got {type(obs).__name__}")
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        raise TextEnvCheckError(f"{where}: reward must be a float, got {type(reward).__name__}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise TextEnvCheckError(f"{where}: terminated and truncated must be bool")
    _check_info(info, where)
    return obs, float(reward), terminated, truncated, info


def _rollout(env: Any, seed: int, actions: list[str], options: dict[str, Any] | None) -> list[Any]:
    obs, info = env.reset(seed=seed, options=options)
    trace: list[Any] = [(obs, info.get("task_id"), info.get("admissible_actions"))]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        trace.append((obs, reward, terminated, truncated, info["success"], info["score"],
                      info["action_valid"], info["admissible_actions"]))
        if terminated or truncated:
            obs, info = env.reset(seed=seed + 1, options=options)
            trace.append(("reset", obs))
    return trace


def check_text_env(env_or_id: Any, *, seed: int = 0, n_random_steps: int = 12,
                   options: dict[str, Any] | None = None, skip_gym_check: bool = False,
                   make_kwargs: dict[str, Any] | None = None,
                   progress: Callable[[str], None] | None = None) -> CheckReport:
    """Check a text env (instance or registered id) against the crl-bench contract.

    Args:
        env_or_id: an env instance, or a registered id such as ``"crl/MiniHack-Room-5x5-v0"``
            (then a fresh env is made for each check).
        seed: the seed used for the determinism and fuzz checks.
        n_random_steps: length of the action sequence compared in the determinism check.
        options: passed to ``reset`` (e.g. ``{"task_id": ...}``).
        skip_gym_check: skip gymnasium's ``check_env`` (only for envs it cannot handle).
        make_kwargs: keyword arguments for ``gymnasium.make`` when an id is given.

    Raises:
        TextEnvCheckError: the first broken rule, with what to fix. Warnings from gymnasium's
            ``check_env`` count as failures.
    """
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    say = progress or (lambda _msg: None)
    if isinstance(env_or_id, str):
        from crl_bench.registry import ENVS

        ENVS.entry(env_or_id)  # clear error listing known envs
        env_id = env_or_id

        def make() -> Any:
            return gymnasium.make(env_id, **(make_kwargs or {}))
    else:
        env_id = getattr(getattr(env_or_id, "spec", None), "id", None) or type(env_or_id).__name__
        instance = env_or_id

        def make() -> Any:
            return instance

    report = CheckReport(env_id)

    if not skip_gym_check:
        say("gymnasium check_env")
        env = make()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(getattr(env, "unwrapped", env), skip_render_check=True, skip_close_check=True)
        ours = [w for w in caught if "crl_bench" in str(w.filename) or "gymnasium" in str(w.filename)
                or issubclass(w.category, UserWarning)]
        if ours:
            msgs = "; ".join(f"{w.category.__name__}: {w.message}" for w in ours)
            raise TextEnvCheckError(f"{env_id}: gymnasium's check_env warned: {msgs}")
        report.ok("gymnasium check_env without warnings")

    env = make()
    say("info keys after reset")
    obs, info = env.reset(seed=seed, options=options)
    if not isinstance(obs, str):
        raise TextEnvCheckError(f"{env_id}: reset must return a str observation")
    _check_info(info, f"{env_id} reset")
    _check_clean(obs, info, f"{env_id} reset")
    admissible = info["admissible_actions"]
    report.ok("reset returns (str, info) with the documented keys")

    say("fuzzed actions")
    for action in FUZZ_ACTIONS:
        try:
            res = env.step(action)
        except Exception as exc:  # the contract: feedback, never an exception
            raise TextEnvCheckError(
                f"{env_id}: step({action[:40]!r}...) raised {type(exc).__name__}: {exc}. "
                "Invalid actions must be returned as feedback with info['action_valid']=False.") from exc
        obs, _r, terminated, truncated, info = _check_step_result(res, f"{env_id} step({action[:20]!r})")
        _check_clean(obs, info, f"{env_id} step({action[:20]!r})")
        if admissible is not None and not _admissible(action, admissible) and info["action_valid"]:
            raise TextEnvCheckError(f"{env_id}: fuzzed action {action[:40]!r} is not admissible but "
                                    "info['action_valid'] is True")
        if terminated or truncated:
            obs, info = env.reset(seed=seed, options=options)
            admissible = info["admissible_actions"]
        else:
            admissible = info["admissible_actions"]
    report.ok(f"{len(FUZZ_ACTIONS)} fuzzed actions give feedback, not exceptions; observations "
              "are clean UTF-8 text")

    say("bad reset options")
    try:
        env.reset(seed=seed, options="notadict")
    except (TypeError, ValueError):
        pass
    except Exception as exc:
        raise TextEnvCheckError(
            f"{env_id}: reset(options='notadict') raised {type(exc).__name__}: {exc}. Raise a "
            "TypeError saying options must be a dict (crl_bench.text_env.reset_options).") from exc
    else:
        raise TextEnvCheckError(f"{env_id}: reset(options='notadict') was accepted; raise a "
                                "TypeError (crl_bench.text_env.reset_options).")
    report.ok("reset(options=<not a dict>) is a TypeError/ValueError")

    say("episode end")
    _check_episode_end(env, env_id, seed, options)
    report.ok("steps after the episode ends keep it ended (reward 0, same flags, "
              "action_valid=False)")

    say("determinism")
    import random

    rng = random.Random(seed)
    env.reset(seed=seed, options=options)
    actions: list[str] = []
    _o, info = env.reset(seed=seed, options=options)
    for _ in range(n_random_steps):
        pool = info["admissible_actions"] or ["look", "help", "ls"]
        a = rng.choice(pool)
        actions.append(a)
        _o, _r, term, trunc, info = env.step(a)
        if term or trunc:
            _o, info = env.reset(seed=seed + 1, options=options)
    env_a, env_b = make(), make()
    trace_a = _rollout(env_a, seed, actions, options)
    trace_b = _rollout(env_b if env_b is not env_a else make(), seed, actions, options)
    if trace_a != trace_b:
        first = next(i for i, (x, y) in enumerate(zip(trace_a, trace_b)) if x != y)
        raise TextEnvCheckError(f"{env_id}: same seed and actions gave different results at "
                                f"record {first}: {trace_a[first]!r} vs {trace_b[first]!r}")
    report.ok(f"same seed + {len(actions)} actions -> identical observations and rewards")
    for e in {id(env): env, id(env_a): env_a, id(env_b): env_b}.values():
        if e is not env_or_id:
            e.close()
    if isinstance(env_or_id, str):
        say("use after close")
        _check_after_close(env, env_id, seed, options)
        report.ok("reset/step after close() give a clear error or work")
    return report


def _check_episode_end(env: Any, env_id: str, seed: int, options: dict[str, Any] | None) -> None:
    """Run an episode to its end with an invalid action, then step twice more."""
    env.reset(seed=seed, options=options)
    ended: tuple[bool, bool] | None = None
    for _ in range(MAX_STEPS_TO_END):
        obs, _r, terminated, truncated, info = _check_step_result(env.step(END_ACTION),
                                                                  f"{env_id} step")
        if terminated or truncated:
            ended = (terminated, truncated)
            break
    if ended is None:
        raise TextEnvCheckError(f"{env_id}: {MAX_STEPS_TO_END} invalid actions did not end the "
                                "episode; count every action towards max_steps")
    for i in (1, 2):
        where = f"{env_id} step {i} after the episode ended"
        try:
            res = env.step("look")
        except Exception as exc:
            raise TextEnvCheckError(
                f"{where} raised {type(exc).__name__}: {exc}. The text-env convention: return "
                "the final observation, reward 0, the same end flags and action_valid=False "
                "(TextEnv.step_after_end).") from exc
        obs, reward, terminated, truncated, info = _check_step_result(res, where)
        _check_clean(obs, info, where)
        if (terminated, truncated) != ended or reward != 0.0 or info["action_valid"]:
            raise TextEnvCheckError(
                f"{where} returned terminated={terminated}, truncated={truncated}, "
                f"reward={reward}, action_valid={info['action_valid']}; expected the ending "
                f"flags {ended}, reward 0 and action_valid=False (TextEnv.step_after_end).")


def _check_after_close(env: Any, env_id: str, seed: int, options: dict[str, Any] | None) -> None:
    for call in (lambda: env.reset(seed=seed, options=options), lambda: env.step("look")):
        try:
            call()
        except (AttributeError, TypeError) as exc:
            raise TextEnvCheckError(
                f"{env_id}: after close(), reset/step raised {type(exc).__name__}: {exc}; raise "
                "a RuntimeError saying the env is closed (or reopen it).") from exc
        except Exception:  # a clear error of another kind is fine
            pass
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing twice is the env's business, not this check's
        pass
