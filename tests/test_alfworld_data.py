"""ALFWorld data: finding and unpacking the game files, the game index, task types, the error
for missing data. Needs no TextWorld (only the real archives, via ``_data_paths``)."""

from __future__ import annotations

import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from _data_paths import missing_data_reason, shared_data_dir
from crl_bench.envs.alfworld.games import (
    TASK_TYPES,
    list_games,
    load_split,
    locate_split,
    normalize_task_types,
    parse_task_dir,
)

from crl_bench.data import DataNotFoundError

DATA = shared_data_dir("alfworld")
needs_data = pytest.mark.skipif(DATA is None, reason=missing_data_reason("alfworld"))

# Counts per task type in valid_unseen, from the data's README (ALFWorld's standard split).
VALID_UNSEEN_COUNTS = {"pick_and_place_simple": 24, "look_at_obj_in_light": 18,
                       "pick_clean_then_place_in_recep": 31, "pick_heat_then_place_in_recep": 23,
                       "pick_cool_then_place_in_recep": 21, "pick_two_obj_and_place": 17}


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No data variables set, the crl-bench cache and $ALFWORLD_DATA in empty temp folders."""
    for var in ("CRL_BENCH_ALFWORLD_DATA", "CRL_BENCH_DATA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CRL_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alfworld_home"))
    return tmp_path


def test_parse_task_dir() -> None:
    assert parse_task_dir("pick_heat_then_place_in_recep-Egg-None-Fridge-10") == (
        "pick_heat_then_place_in_recep", "Egg", "None", "Fridge", 10)
    assert parse_task_dir("look_at_obj_in_light-AlarmClock-None-DeskLamp-308")[3] == "DeskLamp"
    for bad in ("trial_T20190908_222917_366542", "a-b-c-d-notanumber", "a-b-c-d-e-6"):
        with pytest.raises(ValueError, match="not an ALFWorld task folder"):
            parse_task_dir(bad)


def test_task_type_filters_accept_names_numbers_and_aliases() -> None:
    assert normalize_task_types(None) == tuple(TASK_TYPES.values())
    assert normalize_task_types("clean") == ("pick_clean_then_place_in_recep",)
    assert normalize_task_types([6, "heat", "2", "pick_and_place_simple", "heat"]) == (
        "pick_two_obj_and_place", "pick_heat_then_place_in_recep", "look_at_obj_in_light",
        "pick_and_place_simple")
    with pytest.raises(ValueError, match="pick_two_obj_and_place"):
        normalize_task_types(["wash"])
    with pytest.raises(ValueError, match="unknown"):
        normalize_task_types(7)
    with pytest.raises(ValueError, match="unknown"):
        normalize_task_types(True)
    with pytest.raises(ValueError, match="empty"):
        normalize_task_types([])


def test_unknown_split_names_the_splits() -> None:
    with pytest.raises(ValueError, match="valid_unseen"):
        locate_split("test")


def test_missing_data_names_env_var_and_download_command(isolated: Path) -> None:
    with pytest.raises(DataNotFoundError) as err:
        locate_split("valid_unseen")
    message = str(err.value)
    assert "CRL_BENCH_ALFWORLD_DATA" in message
    assert "alfworld-download" in message
    assert "ALFWORLD_DATA" in message and str(isolated / "alfworld_home") in message

    from crl_bench.envs.alfworld.env import ALFWorldTextEnv  # the env raises the same error

    with pytest.raises(DataNotFoundError, match="alfworld-download"):
        ALFWorldTextEnv(split="valid_unseen")


def test_folder_without_the_split_says_what_is_missing(isolated: Path) -> None:
    empty = isolated / "empty"
    empty.mkdir()
    with pytest.raises(DataNotFoundError) as err:
        locate_split("valid_seen", empty)
    assert "valid_seen.tar.gz" in str(err.value) and "alfworld-download" in str(err.value)
    with pytest.raises(DataNotFoundError, match="does not exist"):
        locate_split("valid_seen", isolated / "nowhere")


@needs_data
def test_archive_is_unpacked_once_into_the_cache(isolated: Path) -> None:
    split_dir = locate_split("valid_unseen", DATA)
    assert split_dir.is_relative_to(isolated / "cache")
    assert split_dir.parts[-2:] == ("json_2.1.1", "valid_unseen")
    marker = split_dir / "marker"
    marker.write_text("kept")  # a second call must reuse the folder, not unpack again
    assert locate_split("valid_unseen", DATA) == split_dir and marker.exists()
    assert not [p for p in split_dir.parent.parent.parent.iterdir() if p.name.startswith(".")]


@needs_data
def test_valid_unseen_index_matches_alfworld_counts(isolated: Path) -> None:
    games = load_split("valid_unseen", DATA)
    assert len(games) == 134
    assert Counter(g.task_type for g in games) == VALID_UNSEEN_COUNTS
    assert {g.scene for g in games} == {10, 219, 308, 424}
    assert [g.task_id for g in games] == sorted(g.task_id for g in games)
    first = games[0]
    assert first.task_id.startswith("valid_unseen/") and first.task_id.count("/") == 2
    assert first.path.name == "game.tw-pddl" and first.task_type_id == 2
    assert first.object_target == "AlarmClock" and first.parent_target == "DeskLamp"

    only = load_split("valid_unseen", DATA, task_types=["clean", 6])
    assert Counter(g.task_type for g in only) == {"pick_clean_then_place_in_recep": 31,
                                                  "pick_two_obj_and_place": 17}


@needs_data
def test_extracted_tree_and_alfworld_download_folder(isolated: Path) -> None:
    """An extracted json_2.1.1 tree works as data_dir, and $ALFWORLD_DATA is the last resort
    (that is where alfworld-download leaves the games); unplayable games are skipped."""
    home = isolated / "alfworld_home"
    home.mkdir()
    with tarfile.open(DATA / "valid_unseen.tar.gz") as tar:
        tar.extractall(home, filter="data")
    split_dir = home / "json_2.1.1" / "valid_unseen"
    # ALFWorld skips Sliced/movable folders and unsolvable games; so must the index.
    source = next(split_dir.iterdir())
    sliced = split_dir / source.name.replace("-None-", "-Sliced-", 1)
    shutil.copytree(source, sliced)
    unsolvable = split_dir / "pick_and_place_simple-Mug-None-Desk-999"
    shutil.copytree(source, unsolvable)
    for game in unsolvable.glob("*/game.tw-pddl"):
        game.write_text(game.read_text().replace('"solvable": true', '"solvable": false'))

    assert locate_split("valid_unseen", home) == split_dir
    assert locate_split("valid_unseen") == split_dir  # via $ALFWORLD_DATA
    assert len(list_games(split_dir, "valid_unseen")) == 134
    assert not (isolated / "cache" / "alfworld").exists()  # nothing was unpacked
