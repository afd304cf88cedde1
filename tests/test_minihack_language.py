"""The MiniHack language observation: distance words, directions, open runs, the full text.

Expected values are worked out by hand from the rules in
``crl_bench/envs/minihack/language.py``'s docstring.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("nle")

from crl_bench.envs.minihack import language as L  # noqa: E402
from crl_bench.envs.minihack.actions import build_action_words, normalise_action  # noqa: E402


@pytest.mark.parametrize("moves, word", [(0, "here"), (1, "adjacent"), (2, "very near"),
                                         (3, "near"), (4, "near"), (5, "far"), (8, "far"),
                                         (9, "very far"), (78, "very far")])
def test_distance_words_follow_the_documented_thresholds(moves: int, word: str) -> None:
    assert L.distance_word(moves) == word


def test_negative_distance_is_rejected() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        L.distance_word(-1)


@pytest.mark.parametrize("dx, dy, word", [
    (1, 0, "east"), (0, -1, "north"), (0, 1, "south"), (-1, 0, "west"),
    (3, 1, "east"),        # 3 > 2.414 * 1: straight along x
    (2, 1, "southeast"),   # 2 < 2.414: diagonal
    (1, 2, "southeast"), (1, 3, "south"), (-5, -5, "northwest"), (-1, 2, "southwest"),
    (5, -2, "east"),       # 5 > 4.83
    (4, -2, "northeast"),  # 4 < 4.83
    (-13, 5, "west"),      # 13 > 12.07
    (-12, 5, "southwest"), # 12 < 12.07
])
def test_direction_words_by_hand(dx: int, dy: int, word: str) -> None:
    assert L.direction_word(dx, dy) == word


def test_zero_offset_has_no_direction() -> None:
    with pytest.raises(ValueError):
        L.direction_word(0, 0)


@settings(max_examples=300, deadline=None)
@given(dx=st.integers(-78, 78), dy=st.integers(-20, 20))
def test_a_step_in_the_named_direction_brings_a_feature_one_move_closer(dx: int, dy: int) -> None:
    if dx == 0 and dy == 0:
        return
    sx, sy = L.DIRECTION_STEPS[L.DIRECTIONS.index(L.direction_word(dx, dy))]
    before = max(abs(dx), abs(dy))
    after = max(abs(dx - sx), abs(dy - sy))
    assert after == before - 1


def _naive_open_runs(walk: np.ndarray, x: int, y: int) -> list[tuple[int, int]]:
    """Reference: walk square by square."""
    found = []
    for d, (sx, sy) in enumerate(L.DIRECTION_STEPS):
        cx, cy, n = x + sx, y + sy, 0
        while 0 <= cx < L.COLS and 0 <= cy < L.ROWS:
            v = walk[cy, cx]
            if v == 0 or (sx and sy and v == 2):
                break
            n, cx, cy = n + 1, cx + sx, cy + sy
        if n:
            found.append((d, n))
    return found


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), x=st.integers(0, 78), y=st.integers(0, 20),
       density=st.floats(0.3, 1.0))
def test_open_directions_match_a_square_by_square_walk(seed: int, x: int, y: int,
                                                        density: float) -> None:
    rng = np.random.default_rng(seed)
    walk = (rng.random((L.ROWS, L.COLS)) < density).astype(np.uint8)
    walk[rng.random((L.ROWS, L.COLS)) < 0.05] = 2  # open doors
    assert L.open_directions(walk, x, y) == _naive_open_runs(walk, x, y)


def _hand_built_level() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A small lit room; the agent at column 10, row 5 (see the expected text below)."""
    from nle import nethack as nh

    names = [nh.permonst(i).mname for i in range(nh.NUMMONS)]
    cmap = nh.GLYPH_CMAP_OFF
    glyphs = np.full((L.ROWS, L.COLS), cmap + 0, dtype=np.int16)  # unexplored stone
    glyphs[4:7, 9:15] = cmap + 19                                 # floor of a room
    glyphs[4:7, 8] = cmap + 1                                     # a vertical wall
    glyphs[5, 10] = nh.GLYPH_MON_OFF + names.index("rogue")       # the agent
    glyphs[4, 10] = nh.GLYPH_MON_OFF + names.index("jackal")
    glyphs[5, 12] = cmap + 42                                     # arrow trap
    glyphs[7, 14] = cmap + 24                                     # staircase down
    blstats = np.zeros(nh.NLE_BLSTATS_SIZE, dtype=np.int64)
    blstats[0], blstats[1] = 10, 5
    blstats[nh.NLE_BL_HP], blstats[nh.NLE_BL_HPMAX] = 12, 14
    message = np.zeros(256, dtype=np.uint8)
    message[:6] = np.frombuffer(b"Hello.", dtype=np.uint8)
    return glyphs, blstats, message


def test_the_full_text_of_a_hand_built_level() -> None:
    glyphs, blstats, message = _hand_built_level()
    # jackal (0,-1): 1 move north. Trap (2,0): 2 moves east. Walls at (-2,-1), (-2,0), (-2,1):
    # 2 moves northwest/west/southwest, listed by direction index. Stairs (4,2): 4 moves,
    # 4 < 2.414 * 2 so diagonal: near southeast. Open runs: north is the jackal; east runs over
    # floor, trap, floor, floor; the other directions reach one floor square before stone/wall.
    expected = "\n".join([
        "You see:",
        "- jackal (monster): adjacent north",
        "- arrow trap (trap): very near east",
        "- wall: very near southwest, very near west, very near northwest",
        "- staircase down: near southeast",
        "Open directions: northeast 1, east 4, southeast 1, south 1, southwest 1, west 1, "
        "northwest 1.",
        "Health: 12 of 14 HP.",
        "Message: Hello.",
    ])
    assert L.describe(glyphs, blstats, message) == expected


def test_the_compact_view_keeps_the_single_features_and_the_message_only() -> None:
    glyphs, blstats, message = _hand_built_level()
    full = L.describe(glyphs, blstats, message).splitlines()
    compact = L.describe(glyphs, blstats, message, view="compact").splitlines()
    # the full text's lines less extended terrain (walls), open directions and health
    assert compact == ["You see:", "- jackal (monster): adjacent north",
                       "- arrow trap (trap): very near east", "- staircase down: near southeast",
                       "Message: Hello."]
    assert set(compact) <= set(full)
    glyphs[:] = glyphs[0, 0]
    assert L.describe(glyphs, blstats, np.zeros(256, dtype=np.uint8), view="compact") \
        == "You see nothing of note nearby."
    with pytest.raises(ValueError, match="full, compact"):
        L.describe(glyphs, blstats, message, view="short")


def test_the_optional_map_is_cropped_around_the_agent() -> None:
    glyphs, blstats, message = _hand_built_level()
    chars = np.full((L.ROWS, L.COLS), ord(" "), dtype=np.uint8)
    chars[4:7, 9:15] = ord(".")
    chars[4:7, 8] = ord("|")
    chars[5, 10] = ord("@")
    chars[7, 14] = ord(">")
    chars[5, 70] = ord("X")  # outside the 21-column window: must not appear
    text = L.describe(glyphs, blstats, message, chars, show_map=True)
    map_text = text.split("Map (you are @):\n", 1)[1]
    assert map_text.splitlines() == ["|......", "|.@....", "|......", "      >"]
    with pytest.raises(ValueError, match="chars"):
        L.describe(glyphs, blstats, message, None, show_map=True)


def test_nothing_to_describe() -> None:
    glyphs, blstats, message = _hand_built_level()
    glyphs[:] = glyphs[0, 0]  # every square unexplored stone
    text = L.describe(glyphs, blstats, np.zeros(256, dtype=np.uint8))
    assert text.splitlines() == ["You see nothing of note nearby.", "Open directions: none known.",
                                 "Health: 12 of 14 HP."]


def test_hit_point_indices_are_nle_s() -> None:
    from nle import nethack as nh

    assert (L._BL_HP, L._BL_HPMAX) == (nh.NLE_BL_HP, nh.NLE_BL_HPMAX)
    assert nh.DUNGEON_SHAPE == (L.ROWS, L.COLS)


def test_action_words_for_room_and_corridor_action_sets() -> None:
    from nle import nethack as nh

    room = build_action_words(tuple(nh.CompassDirection))
    assert [w.text for w in room] == list(L.DIRECTIONS)
    corridor = build_action_words(tuple(nh.CompassDirection)
                                  + (nh.Command.OPEN, nh.Command.KICK, nh.Command.SEARCH))
    texts = [w.text for w in corridor]
    assert texts[:8] == list(L.DIRECTIONS)
    assert texts[8:16] == [f"open {d}" for d in L.DIRECTIONS]
    assert texts[16:24] == [f"kick {d}" for d in L.DIRECTIONS]
    assert texts[24:] == ["search"]
    # "open east" presses OPEN, then the east key
    open_east = corridor[texts.index("open east")]
    actions = tuple(nh.CompassDirection) + (nh.Command.OPEN, nh.Command.KICK, nh.Command.SEARCH)
    assert [int(actions[i]) for i in open_east.steps] == [ord("o"), ord("l")]


def test_a_directional_command_without_moves_is_rejected() -> None:
    from nle import nethack as nh

    with pytest.raises(ValueError, match="compass directions"):
        build_action_words((nh.Command.KICK,))


def test_action_normalisation() -> None:
    assert normalise_action("  North ") == "north"
    assert normalise_action("open \t EAST") == "open east"
    assert normalise_action("north\x00") == "north\x00"
