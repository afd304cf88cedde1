"""``crl/SWE-v0``: repair a repository so that hidden tests pass, with a sandboxed shell and editor.

An episode is one SWE-bench instance. The agent sees the issue text and the tool syntax
(:data:`crl_bench.envs.swe.tools.TOOL_HELP`), then acts with free-form text actions
(``admissible_actions`` is ``None``): run a shell command, view a file, search, create a file,
replace text, submit. Every action counts towards ``max_steps`` (50 by default, as in the
paper); invalid ones come back as feedback with ``action_valid=False``.

Grading happens on ``submit`` (or when the step cap is reached, unless
``grade_on_truncation=False``), the SWE-bench way and stricter (:mod:`..evaluation`): the
workspace's patch (every file, ignored ones too) goes onto a fresh copy of the base without the
files that can hook a test run, the test patch is applied, the tests run in a clean process, and
the ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` outcomes come from pytest's reports, not the log.
``success`` = all of them pass; ``score`` = the fraction that pass; ``reward`` = 1.0 on success
else 0.0 (``reward="score"`` gives the fraction instead).
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from crl_bench.envs.swe.evaluation import (DEFAULT_MAX_PATCH_BYTES, Grading, exclusion,
                                           grade_sandbox, split_diff)
from crl_bench.envs.swe.grading import GradeReport, grade
from crl_bench.envs.swe.patches import patch_to_actions
from crl_bench.envs.swe.sandbox import (MiB, PatchTooLargeError, Sandbox, SandboxError,
                                        SandboxLimits)
from crl_bench.envs.swe.tasks import SWETask, TaskSet, check_task_set_name, make_task_set
from crl_bench.envs.swe.tools import TOOL_HELP, ToolOutput, ToolRunner, run_action_text
from crl_bench.text_env import TextEnv, coerce_action, reset_options

INTRO = """\
<issue>
{problem}
</issue>

You are in the repository {repo} at /testbed (its base commit). Resolve the issue above by
changing the source code; do not change the existing tests. When you submit, hidden tests check
your change. You have {max_steps} actions.

{tools}"""


MAX_TIMEOUT_S = 24 * 3600.0  # a command or a grading that needs a day is a mistake
SETTINGS = ("task_set", "split", "data_dir", "backend", "command_timeout_s", "eval_timeout_s",
            "max_observation_chars", "isolation", "reward", "grade_on_truncation", "python",
            "sandbox_limits", "docker_image", "render_mode", "max_patch_bytes")


def check_settings(**settings: Any) -> None:
    """Check the env's settings (the keyword arguments of :class:`SWETextEnv`) without building
    anything: a run checks them before it writes its folder. Raises ``ValueError`` naming the
    setting and the fix."""
    unknown = sorted(set(settings) - set(SETTINGS) - {"max_steps"})
    if unknown:
        raise ValueError(f"unknown SWE env setting(s) {unknown}; known: {', '.join(SETTINGS)}.")

    def number(name: str, low: float, high: float) -> None:
        value = settings.get(name)
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or not low < value <= high:
            raise ValueError(f"{name}={str(value)[:60]}: must be a finite number of seconds/units "
                             f"above {low:g} and at most {high:g}.")

    if settings.get("backend", "local") not in ("local", "docker"):
        raise ValueError("backend must be 'local' or 'docker', got "
                         f"{str(settings['backend'])[:60]!r}.")
    if settings.get("reward", "success") not in ("success", "score"):
        raise ValueError("reward must be 'success' or 'score', got "
                         f"{str(settings['reward'])[:60]!r}.")
    number("command_timeout_s", 0, MAX_TIMEOUT_S)
    number("eval_timeout_s", 0, MAX_TIMEOUT_S)
    number("max_observation_chars", 0, 10**8)
    number("max_patch_bytes", 0, 2**31)
    isolation = settings.get("isolation", "auto")
    if isolation not in ("auto", "namespaces", "unsafe-rlimits"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'unsafe-rlimits', got "
                         f"{str(isolation)[:60]!r}.")
    limits = settings.get("sandbox_limits")
    if isinstance(limits, dict):
        try:
            SandboxLimits(**limits)
        except TypeError as exc:
            raise ValueError(f"sandbox_limits: {exc}") from None
    elif limits is not None and not isinstance(limits, SandboxLimits):
        raise ValueError("sandbox_limits must be a dict of SandboxLimits fields.")
    check_task_set_name(settings.get("task_set", "mini"))


class SWETextEnv(TextEnv):
    """Repository repair with a sandboxed shell and editor, graded by FAIL_TO_PASS/PASS_TO_PASS.

    Args:
        task_set: ``"mini"`` (our handykit tasks, fast), ``"lite-dev-local"`` (11 SWE-bench Lite
            dev instances rebuilt offline), or a path to a ``.json``/``.jsonl`` file of SWE-bench
            instances (docker backend only).
        split: ``"train"`` / ``"test"`` / ``"all"`` for ``mini`` (default ``train``); ``"dev"``
            for ``lite-dev-local``.
        data_dir: the task set's data folder (``lite-dev-local``: the folder holding
            ``swebench_lite_dev.json`` and ``local_workspaces.json``; resolved with
            ``crl_bench.data.resolve_data_dir("swe", ...)``).
        backend: ``"local"`` (a confined workspace on this machine) or ``"docker"`` (SWE-bench
            harness images; needs a Docker engine).
        max_steps: action cap per episode.
        command_timeout_s: wall-clock limit of one ``run`` command.
        eval_timeout_s: the grading budget (patch, fresh tree, test run together), seconds; how
            long grading took and whether it ran out are in ``info["grading"]``.
        max_patch_bytes: a larger patch is not graded (reported as too large, reward 0).
        max_observation_chars: longer observations keep head and tail with a marker.
        isolation: local backend confinement: ``"auto"``/``"namespaces"`` (refuse to start
            without namespaces) or ``"unsafe-rlimits"`` (see :class:`LocalSandbox`).
        reward: ``"success"`` (1/0) or ``"score"`` (fraction of tests passing).
        grade_on_truncation: grade the workspace when the step cap is hit without a submit.
        python: (``lite-dev-local``) the Python 3.9 interpreter for its venv.
        sandbox_limits: a :class:`SandboxLimits` (or its fields as a dict) for every command.
        docker_image: (docker) image name template; ``{instance_id}`` is filled in.
    """

    family = "swe"

    def __init__(self, task_set: str = "mini", split: str | None = None,
                 data_dir: str | None = None, backend: str = "local", max_steps: int = 50,
                 command_timeout_s: float = 60.0, eval_timeout_s: float = 900.0,
                 max_observation_chars: int = 6000, isolation: str = "auto",
                 reward: str = "success", grade_on_truncation: bool = True,
                 python: str | None = None,
                 sandbox_limits: SandboxLimits | dict[str, Any] | None = None,
                 docker_image: str | None = None, render_mode: str | None = None,
                 max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        check_settings(backend=backend, reward=reward, command_timeout_s=command_timeout_s,
                       eval_timeout_s=eval_timeout_s, max_observation_chars=max_observation_chars,
                       isolation=isolation, sandbox_limits=sandbox_limits,
                       max_patch_bytes=max_patch_bytes, task_set=task_set)
        self.task_set: TaskSet = make_task_set(task_set, data_dir, python=python)
        self.split = split or self.task_set.default_split
        self.task_ids = self.task_set.task_ids(self.split)
        if not self.task_ids:
            raise ValueError(f"Task set {task_set!r} split {self.split!r} is empty.")
        self.backend = backend
        self.command_timeout_s = float(command_timeout_s)
        self.eval_timeout_s = float(eval_timeout_s)
        self.max_observation_chars = int(max_observation_chars)
        self.isolation = isolation
        self.reward_mode = reward
        self.grade_on_truncation = grade_on_truncation
        self.docker_image = docker_image
        if isinstance(sandbox_limits, dict):
            sandbox_limits = SandboxLimits(**sandbox_limits)
        self.limits = sandbox_limits or SandboxLimits(timeout_s=self.command_timeout_s)
        self.sandbox: Sandbox | None = None
        self._sandbox_key: Any = None
        self._runner: ToolRunner | None = None
        self.task: SWETask | None = None
        self._test_command = ""
        self._steps = 0
        self._last_grade: GradeReport | None = None
        self._model_patch = ""
        self._test_log = ""
        self._base_rev = "HEAD"
        self._grading: Grading | None = None
        self._runtime_env: dict[str, str] = {}
        self.max_patch_bytes = int(max_patch_bytes)

    # -- episode -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = reset_options(options)
        self.start_episode()
        task_id = options.get("task_id")
        if task_id is None:
            task_id = self.task_ids[int(self.np_random.integers(len(self.task_ids)))]
        self.task = self.task_set.task(str(task_id))
        self._prepare_sandbox(self.task)
        self._steps = 0
        self._last_grade = None
        self._grading = None
        self._model_patch = ""
        self._test_log = ""
        obs = INTRO.format(problem=self.task.problem_statement.strip(), repo=self.task.repo,
                           max_steps=self.max_steps, tools=TOOL_HELP)
        self._last_observation = obs
        return obs, self._info(action_valid=True)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None or self._runner is None:
            raise RuntimeError("step() before reset(): call env.reset() first.")
        after_end = self.step_after_end()  # the text-env convention (crl_bench.text_env)
        if after_end is not None:
            return after_end
        text = coerce_action(action)
        self._steps += 1
        try:
            parsed, out = run_action_text(self._runner, text)
        except Exception as exc:  # noqa: BLE001 - a bad action is feedback, never a crash
            parsed, out = None, ToolOutput(f"Error: the action failed: {type(exc).__name__}: "
                                           f"{exc}", ok=False, extra={"tool_error": repr(exc)})
        extra: dict[str, Any] = {"tool": parsed.tool if parsed else None, **out.extra}
        reward, terminated, truncated = 0.0, False, False
        obs = out.text
        if parsed is not None and parsed.tool == "submit":
            report = self._grade()
            obs = "Submitted. " + report.summary()
            terminated = True
        elif self._steps >= self.max_steps:
            truncated = True
            obs += f"\n\n[Step limit of {self.max_steps} actions reached.]"
            if self.grade_on_truncation:
                report = self._grade()
                obs += " Your changes were graded as they are:\n" + report.summary()
        if terminated or truncated:
            if self._last_grade is not None:
                reward = (1.0 if self._last_grade.resolved else 0.0) \
                    if self.reward_mode == "success" else self._last_grade.score
        return self.finish_step(obs, reward, terminated, truncated,
                                self._info(action_valid=out.ok, **extra))

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
            self._runner = None
        super().close()

    # -- helpers -------------------------------------------------------------------------------
    def _info(self, action_valid: bool, **extra: Any) -> dict[str, Any]:
        assert self.task is not None
        info = self.make_info(
            goal=self.task.problem_statement.strip(), admissible_actions=None,
            success=bool(self._last_grade and self._last_grade.resolved),
            score=float(self._last_grade.score) if self._last_grade else 0.0,
            action_valid=action_valid, task_id=self.task.instance_id,
            repo=self.task.repo, steps=self._steps, **extra)
        if self._last_grade is not None:
            info["tests"] = self._last_grade.as_dict()
            info["patch"] = self._model_patch
            if self._grading is not None:
                info["grading"] = self._grading.as_dict()
        return info

    def _prepare_sandbox(self, task: SWETask) -> None:
        if self.backend == "docker":
            from crl_bench.envs.swe.docker_sandbox import DockerSandbox

            if self.sandbox is None:
                self.sandbox = DockerSandbox(limits=self.limits, image_template=self.docker_image)
            self.sandbox.prepare(self.sandbox.image_for(task.instance_id))
            self._test_command = task.extra.get("test_command") or (
                "pytest -rA -p no:cacheprovider " + " ".join(map(shlex.quote, task.test_files)))
        else:
            from crl_bench.envs.swe.sandbox import LocalSandbox

            runtime = self.task_set.local_runtime(task)
            key = (str(runtime.venv), runtime.ro_binds, tuple(sorted(runtime.env.items())))
            if self.sandbox is None or key != self._sandbox_key:
                if self.sandbox is not None:
                    self.sandbox.close()
                self.sandbox = LocalSandbox(limits=self.limits, isolation=self.isolation,
                                            venv=str(runtime.venv), ro_binds=runtime.ro_binds,
                                            env=dict(runtime.env),
                                            hide=self.task_set.data_paths())
                self._sandbox_key = key
            self.sandbox.prepare(runtime.template)
            self._test_command = runtime.test_command
            self._runtime_env = dict(runtime.env)
        self._runner = ToolRunner(self.sandbox, max_observation_chars=self.max_observation_chars,
                                  command_timeout_s=self.command_timeout_s)
        # The base is pinned now: an agent that commits its own changes (tests included) must
        # not move what grading resets the test files to.
        head = self.sandbox.run("git rev-parse HEAD", timeout_s=60)
        self._base_rev = head.output.strip() if head.exit_code == 0 else "HEAD"

    def _grade(self) -> GradeReport:
        """Grade the workspace on a fresh copy of the base (see :mod:`..evaluation`)."""
        assert self.task is not None and self.sandbox is not None
        task, sb = self.task, self.sandbox
        self._model_patch = ""
        try:
            full = self._workspace_patch()
        except PatchTooLargeError as exc:  # refused before it was held: graded as too large
            report = grade({}, task.fail_to_pass, task.pass_to_pass, note=exc.note)
            self._grading = Grading(timeout_s=self.eval_timeout_s, problem=exc.note,
                                    patch_bytes=exc.bytes_seen, patch_too_large=True)
            self._last_grade = report
            return report
        except SandboxError as exc:
            full = ""
            report = grade({}, task.fail_to_pass, task.pass_to_pass,
                           note=f"Your changes could not be read: {exc}")
            self._grading = Grading(timeout_s=self.eval_timeout_s, problem=str(exc))
            self._last_grade = report
            return report
        # byte-code caches are noise in the stored patch; everything else (hooks too) is kept
        self._model_patch = "".join(c for p, c in split_diff(full)
                                    if exclusion(p, frozenset()) != "byte-code cache")
        report, self._grading, self._test_log = grade_sandbox(
            sb, patch=self._model_patch, test_patch=task.test_patch, test_files=task.test_files,
            test_command=self._test_command, fail_to_pass=task.fail_to_pass,
            pass_to_pass=task.pass_to_pass, env=self._runtime_env,
            timeout_s=self.eval_timeout_s, max_patch_bytes=self.max_patch_bytes)
        if self._grading.patch_too_large:
            self._model_patch = ""
        self._last_grade = report
        return report

    def _workspace_patch(self) -> str:
        sb = self.sandbox
        assert sb is not None
        if hasattr(sb, "workspace_diff"):
            return sb.workspace_diff(timeout_s=min(120.0, self.eval_timeout_s),
                                     max_bytes=self.max_patch_bytes)
        base = shlex.quote(self._base_rev)
        diff = sb.run("export GIT_INDEX_FILE=$(mktemp); git -c core.hooksPath=/dev/null "
                      "-c core.fsmonitor=false add -A -f . >/dev/null 2>&1 && "
                      f"git -c core.hooksPath=/dev/null diff --cached --binary {base}",
                      timeout_s=120, output_keep_bytes=self.max_patch_bytes + MiB)
        if diff.exit_code != 0 or diff.output_truncated or diff.output_flood:
            raise SandboxError(f"git diff failed or its output was cut: {diff.status_line()}")
        return diff.output

    # -- for tests, scripts and scripted agents ----------------------------------------------
    def reference_actions(self) -> list[str]:
        """The gold patch of the current task as this env's own edit actions, then ``submit``.

        Computed against the current workspace (a hunk that is not unique becomes a whole-file
        ``create``). Used to check that the gold patch, applied through the tools, resolves
        the task.
        """
        if self.task is None or self.sandbox is None:
            raise RuntimeError("reference_actions() needs a task: call reset() first.")
        return patch_to_actions(self.task.patch, read_file=self.sandbox.read_file) + ["submit"]

    @property
    def last_grade(self) -> GradeReport | None:
        return self._last_grade
