"""ALFWorld's game files: where they are, unpacking them once, and the per-split game index.

Nothing here imports TextWorld; listing the 3,553 train games takes a fraction of a second.

Data folder (resolved by :func:`crl_bench.data.resolve_data_dir`, family ``"alfworld"``):

1. ``data_dir=`` (constructor keyword), ``$CRL_BENCH_ALFWORLD_DATA``, ``$CRL_BENCH_DATA/alfworld``
   or ``<cache>/data/alfworld``; the folder holds either the split archives
   (``train.tar.gz``, ``valid_seen.tar.gz``, ``valid_unseen.tar.gz``, ``valid_train.tar.gz``,
   the project's offline copy) or an extracted ``json_2.1.1/<split>/`` tree;
2. otherwise ALFWorld's own download folder, ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``),
   which ``alfworld-download`` fills with ``json_2.1.1/<split>/.../game.tw-pddl``.

An archive is unpacked once into ``<crl-bench cache>/alfworld/games/`` (atomically, so that
several processes may start at the same time) and read from there afterwards.

Games (ALFWorld's layout)::

    json_2.1.1/<split>/<task_type>-<Object>-<MovableRecep>-<Receptacle|Lamp>-<scene>/<trial>/
        game.tw-pddl

A game's task id is ``"<split>/<task dir>/<trial>"``. Like ALFWorld's ``collect_game_files``,
the index skips ``movable`` and ``Sliced`` games and games whose file says ``"solvable": false``.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from crl_bench.data import DataNotFoundError, cache_dir, env_var, resolve_data_dir

FAMILY = "alfworld"
SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen", "valid_train")
GAME_FILE = "game.tw-pddl"
ROOT_FOLDER = "json_2.1.1"  # the folder name ALFWorld's configs and alfworld-download use

# ALFWorld's numbering (alfworld.agents.environment.alfred_tw_env.TASK_TYPES) and short aliases.
TASK_TYPES: dict[int, str] = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
TASK_TYPE_ALIASES: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick_two": "pick_two_obj_and_place",
}
TASK_TYPE_IDS: dict[str, int] = {name: i for i, name in TASK_TYPES.items()}

DOWNLOAD_HINT = ("pip install 'crl-bench[alfworld]' && alfworld-download   "
                 "(ALFWorld's own download, needs the internet: it fills $ALFWORLD_DATA, default "
                 "~/.cache/alfworld, with json_2.1.1/<split>/..., which crl-bench then finds by "
                 "itself)")

_SOLVABLE = re.compile(rb'"solvable"\s*:\s*(true|false)')


@dataclass(frozen=True)
class GameRecord:
    """One ALFWorld game (a trial of a task) and what its folder names say about it.

    Attributes:
        task_id: ``"<split>/<task dir>/<trial>"``, usable as ``options={"task_id": ...}``.
        path: the ``game.tw-pddl`` file.
        task_type: one of :data:`TASK_TYPES`' names; ``task_type_id`` is its number (1-6).
        object_target, parent_target: the object to handle and the receptacle (for
            ``look_at_obj_in_light`` ``parent_target`` is the lamp).
        scene: AI2-THOR floor-plan number.
    """

    task_id: str
    split: str
    path: Path
    task_type: str
    task_type_id: int
    object_target: str
    parent_target: str
    scene: int


def parse_task_dir(name: str) -> tuple[str, str, str, str, int]:
    """Split a task folder name into (task type, object, movable receptacle, receptacle, scene).

    ``"pick_heat_then_place_in_recep-Egg-None-Fridge-10"`` ->
    ``("pick_heat_then_place_in_recep", "Egg", "None", "Fridge", 10)``.

    Raises:
        ValueError: the name does not have ALFWorld's five ``-``-separated fields.
    """
    parts = name.split("-")
    if len(parts) != 5 or not parts[4].isdigit():
        raise ValueError(f"{name!r} is not an ALFWorld task folder name "
                         "(<task_type>-<Object>-<MovableRecep>-<Receptacle>-<scene>)")
    return parts[0], parts[1], parts[2], parts[3], int(parts[4])


def normalize_task_types(task_types: Iterable[str | int] | str | int | None) -> tuple[str, ...]:
    """Task-type filter -> ALFWorld task-type names (all six for ``None``).

    Accepts ALFWorld's names (``"pick_clean_then_place_in_recep"``), the short aliases of
    :data:`TASK_TYPE_ALIASES` (``"clean"``) and ALFWorld's numbers 1-6, alone or in a list.
    """
    if task_types is None:
        return tuple(TASK_TYPES.values())
    if isinstance(task_types, (str, int)):
        task_types = [task_types]
    names: list[str] = []
    for item in task_types:
        if isinstance(item, bool):  # True is an int, but not a task type
            name = None
        elif isinstance(item, int) or (isinstance(item, str) and item.strip().isdigit()):
            name = TASK_TYPES.get(int(item))
        else:
            key = str(item).strip().lower()
            name = key if key in TASK_TYPE_IDS else TASK_TYPE_ALIASES.get(key)
        if name is None:
            known = ", ".join(f"{i}/{n}/{a}"
                              for (i, n), a in zip(TASK_TYPES.items(), TASK_TYPE_ALIASES))
            raise ValueError(f"task type {item!r} is unknown; use ALFWorld's number, name or alias "
                             f"(number/name/alias): {known}.")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("task_types is empty; pass None for all six task types.")
    return tuple(names)


# -- locating the data ---------------------------------------------------------------------------
def _alfworld_download_dir() -> Path:
    """ALFWorld's own data folder (where ``alfworld-download`` puts the games)."""
    return Path(os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld").expanduser()


def _extracted_split(folder: Path, split: str) -> Path | None:
    """The ``<split>`` folder of an extracted tree under ``folder``, if there is one."""
    for candidate in (folder / ROOT_FOLDER / split, folder / split):
        if candidate.is_dir() and any(candidate.iterdir()):
            return candidate
    return None


def unpack_split_archive(archive: Path, split: str) -> Path:
    """Unpack ``<split>.tar.gz`` once into the cache and return its ``json_2.1.1/<split>`` folder.

    The cache folder's name carries the archive's size and modification time, so a replaced
    archive is unpacked again. Unpacking goes to a temporary folder that is renamed into place,
    so concurrent processes never see half an archive.
    """
    stat = archive.stat()
    root = cache_dir() / FAMILY / "games"
    final = root / f"{split}-{stat.st_size}-{int(stat.st_mtime)}"
    target = final / ROOT_FOLDER / split
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{split}-", dir=root))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12/3.11.4: refuse unsafe members
                tar.extractall(staging, filter="data")
            else:  # pragma: no cover - older Pythons
                for member in tar.getmembers():
                    if member.name.startswith(("/", "..")) or ".." in Path(member.name).parts:
                        raise ValueError(f"{archive}: unsafe member {member.name!r}")
                tar.extractall(staging)
        if not (staging / ROOT_FOLDER / split).is_dir():
            raise DataNotFoundError(f"{archive} does not contain {ROOT_FOLDER}/{split}/; it is "
                                    f"not an ALFWorld {split} archive.")
        try:
            staging.rename(final)
        except OSError:  # another process finished first; its copy is as good as ours
            if not target.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def locate_split(split: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the folder holding the task folders of ``split`` (unpacking an archive if needed).

    Raises:
        ValueError: unknown split.
        DataNotFoundError: no data; the message names ``CRL_BENCH_ALFWORLD_DATA``, the cache
            folder and the download command (``alfworld-download``).
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is unknown; use one of {', '.join(SPLITS)}.")
    try:
        folder = resolve_data_dir(FAMILY, data_dir, download_hint=DOWNLOAD_HINT)
    except DataNotFoundError as err:
        if data_dir is None:  # last resort: ALFWorld's own download folder
            found = _extracted_split(_alfworld_download_dir(), split)
            if found is not None:
                return found
        raise DataNotFoundError(
            f"{err}\n  4. or run ALFWorld's download and leave it in $ALFWORLD_DATA "
            f"(now {_alfworld_download_dir()}, which has no {ROOT_FOLDER}/{split}/).") from None
    archive = folder / f"{split}.tar.gz"
    if archive.is_file():
        return unpack_split_archive(archive, split)
    found = _extracted_split(folder, split)
    if found is not None:
        return found
    raise DataNotFoundError(
        f"The ALFWorld data folder {folder} has neither {split}.tar.gz nor "
        f"{ROOT_FOLDER}/{split}/.\n"
        f"Point {env_var(FAMILY)} (or data_dir=) at a folder with the split archives, or at "
        f"ALFWorld's data folder ($ALFWORLD_DATA). To download ALFWorld's games: {DOWNLOAD_HINT}")


# -- the index -------------------------------------------------------------------------------------
def _says_solvable(path: Path) -> bool:
    """Read the ``solvable`` flag (near the file's end), not the whole JSON."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 8192))
        match = _SOLVABLE.search(f.read())
        if match is None:  # unusual key order: read it all
            f.seek(0)
            match = _SOLVABLE.search(f.read())
    return match is not None and match.group(1) == b"true"


def list_games(split_dir: Path, split: str) -> list[GameRecord]:
    """Every playable game under ``split_dir`` (one ``<split>`` folder), sorted by task id."""
    games: list[GameRecord] = []
    for task_dir in sorted(p for p in split_dir.iterdir() if p.is_dir()):
        if "movable" in task_dir.name or "Sliced" in task_dir.name:
            continue  # ALFWorld does not play these either
        try:
            task_type, obj, _mrecep, recep, scene = parse_task_dir(task_dir.name)
        except ValueError:
            continue
        if task_type not in TASK_TYPE_IDS:
            continue
        for trial in sorted(p for p in task_dir.iterdir() if p.is_dir()):
            path = trial / GAME_FILE
            if not path.is_file() or not _says_solvable(path):
                continue
            games.append(GameRecord(
                task_id=f"{split}/{task_dir.name}/{trial.name}", split=split, path=path,
                task_type=task_type, task_type_id=TASK_TYPE_IDS[task_type], object_target=obj,
                parent_target=recep, scene=scene))
    return games


_INDEX: dict[tuple[str, str], list[GameRecord]] = {}
_INDEX_LOCK = threading.Lock()


def load_split(split: str, data_dir: str | os.PathLike[str] | None = None,
               task_types: Iterable[str | int] | str | int | None = None) -> list[GameRecord]:
    """The games of ``split`` (optionally only some task types), sorted by task id.

    A split folder is listed once per process (train: 3,553 folders, ~1-2 s on a busy disk);
    every env made afterwards reuses the list.
    """
    wanted = set(normalize_task_types(task_types))
    split_dir = locate_split(split, data_dir)
    key = (str(split_dir), split)
    with _INDEX_LOCK:
        if key not in _INDEX:
            _INDEX[key] = list_games(split_dir, split)
        listed = _INDEX[key]
    games = [g for g in listed if g.task_type in wanted]
    if not games:
        raise DataNotFoundError(f"No playable ALFWorld games of types {sorted(wanted)} in "
                                f"{split_dir}.")
    return games
