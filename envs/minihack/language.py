"""The language observation of the MiniHack text envs, written from NLE's arrays.

Input per step: NLE's ``glyphs`` (21 x 79 int16, one glyph id per map square; remembered squares
keep their last glyph), ``blstats`` (the agent's column and row are entries 0 and 1, hit points
entries ``NLE_BL_HP``/``NLE_BL_HPMAX``), ``message`` (256 bytes) and, for the optional map,
``chars`` (21 x 79 uint8 ASCII).

Output, for example::

    You see:
    - staircase down: far southeast
    - jackal (monster): adjacent north
    - wall: adjacent west, near north, very far east
    Open directions: east 4, southeast 4, south 4.
    Health: 14 of 14 HP.
    Message: It's solid stone.

Rules the text follows (tests and the scripted agent rely on them):

* Each feature line is ``- NAME[ (KIND)]: PLACE[, PLACE...]`` with ``PLACE = DISTANCE DIRECTION``.
  KIND is ``monster``, ``pet``, ``trap`` or ``object``; terrain (stairs, doors, fountains...) has
  none. Monsters, objects, traps, doors and other single features get one line each, nearest
  first. Extended terrain (walls, corridors, trees, water, lava, iron bars) gets one line per
  kind listing the nearest square of that kind in each direction where there is one.
* DISTANCE is the number of king moves (Chebyshev distance, the moves needed on open floor):
  1 ``adjacent``, 2 ``very near``, 3-4 ``near``, 5-8 ``far``, 9 or more ``very far``.
* DIRECTION is one of the 8 compass words, taken from the angle of the offset: a square more than
  tan(67.5 deg) ~ 2.414 times as far along one axis as along the other is straight along that
  axis, anything else is diagonal. With this rule a move in the named direction always brings a
  feature on open floor one move closer.
* ``Open directions`` lists, for each compass direction with a known walkable square next to the
  agent, how many known walkable squares follow in a straight line (floor, corridor, doorway,
  stairs, traps, objects; not walls, closed doors, water, lava, monsters or unexplored squares;
  an open door cannot be entered or left diagonally, as in NetHack).
* Unexplored squares (blank on the map), floor (lit or remembered) and the agent's own square
  are not listed; past the nearest 40 single features the rest are counted, not listed.

Views (``view=``): ``"full"`` (the default, above) or ``"compact"``: only the single features
(stairs, monsters, objects, traps, doors...) and the game message; no extended terrain, open
directions or health. In an open room the compact text names one direction, the goal's: the
shortest observation that still solves the task (the greedy walker of the tests does), for
probing whether a small model reads at all (``experiments/minihack_reading.py``; measured: the
untrained 135M actor does not, under either view, ``results/minihack_room_random.md``)::

    You see:
    - staircase down: far southeast
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

ROWS, COLS = 21, 79  # NLE's map (nle.nethack.DUNGEON_SHAPE)

DIRECTIONS: tuple[str, ...] = ("north", "northeast", "east", "southeast", "south", "southwest",
                               "west", "northwest")
# (dx, dy) of one step in each direction; dy grows southwards, as the map's rows do.
DIRECTION_STEPS: tuple[tuple[int, int], ...] = ((0, -1), (1, -1), (1, 0), (1, 1), (0, 1), (-1, 1),
                                                (-1, 0), (-1, -1))
DISTANCE_WORDS: tuple[str, ...] = ("here", "adjacent", "very near", "near", "far", "very far")
# Chebyshev distance d (in moves) -> index into DISTANCE_WORDS.
_DISTANCE_BOUNDS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 10**6))
_TAN_67_5 = 2.414213562373095

MAP_CROP_ROWS, MAP_CROP_COLS = 11, 21  # the optional map: 5 rows and 10 columns around the agent
MAX_LISTED_FEATURES = 40  # keeps the text bounded on cluttered levels
VIEWS: tuple[str, ...] = ("full", "compact")


def distance_word(moves: int) -> str:
    """Word for a Chebyshev distance in moves.

    1 adjacent, 2 very near, 3-4 near, 5-8 far, 9 or more very far (0 is "here").
    """
    if moves < 0:
        raise ValueError(f"distance must be >= 0 moves, got {moves}")
    for word, (lo, hi) in zip(DISTANCE_WORDS, _DISTANCE_BOUNDS):
        if lo <= moves <= hi:
            return word
    return DISTANCE_WORDS[-1]


def direction_index(dx: int, dy: int) -> int:
    """Index into :data:`DIRECTIONS` of the offset (dx columns east, dy rows south).

    -1 for (0, 0).
    """
    if dx == 0 and dy == 0:
        return -1
    ax, ay = abs(dx), abs(dy)
    if ax > _TAN_67_5 * ay:
        return 2 if dx > 0 else 6
    if ay > _TAN_67_5 * ax:
        return 4 if dy > 0 else 0
    if dx > 0:
        return 3 if dy > 0 else 1
    return 5 if dy > 0 else 7


def direction_word(dx: int, dy: int) -> str:
    """Compass word of the offset (dx columns east, dy rows south), e.g. (2, -1) -> "northeast"."""
    i = direction_index(dx, dy)
    if i < 0:
        raise ValueError("the offset (0, 0) has no direction")
    return DIRECTIONS[i]


# Offset tables indexed by [dy + ROWS - 1, dx + COLS - 1]: every offset between two map squares.
_DY = np.arange(-(ROWS - 1), ROWS)[:, None]
_DX = np.arange(-(COLS - 1), COLS)[None, :]
_DIRECTION_TABLE = np.array([[direction_index(int(dx), int(dy)) for dx in _DX[0]]
                             for dy in _DY[:, 0]],
                            dtype=np.int8)
_CHEBYSHEV = np.maximum(np.abs(_DX), np.abs(_DY))
_DISTANCE_INDEX = [next(i for i, (lo, hi) in enumerate(_DISTANCE_BOUNDS) if lo <= d <= hi)
                   for d in range(COLS)]
# Per offset: Chebyshev distance << 24 | direction (the low 3 bits), flattened.
_DIST_DIR_KEY = ((_CHEBYSHEV.astype(np.int64) << 24)
                 | np.maximum(_DIRECTION_TABLE, 0).astype(np.int64)).ravel()
_CODE_MASK = (1 << 20) - 1
_GROUPED_BIT = 1 << 23
_CODE_DIR_MASK = (1 << 24) - 1
# Flat map square -> its part of the flat offset index (row * (2 * COLS - 1) + column).
_CELL_OFFSET = (np.arange(ROWS)[:, None] * (2 * COLS - 1) + np.arange(COLS)[None, :]).ravel()
# "far southeast" for every (distance in moves, direction index).
_PLACES = [[f"{DISTANCE_WORDS[_DISTANCE_INDEX[d]]} {name}" for name in DIRECTIONS]
           for d in range(COLS)]
_BL_HP, _BL_HPMAX = 10, 11  # nle.nethack.NLE_BL_HP / NLE_BL_HPMAX (checked in the tests)


# ---------------------------------------------------------------------------------------------
# Glyph table: what each of NLE's glyph ids means for the text (built once, from NLE's tables).
# ---------------------------------------------------------------------------------------------

KIND_TERRAIN, KIND_MONSTER, KIND_PET = "", "monster", "pet"
KIND_TRAP, KIND_OBJECT = "trap", "object"

# NetHack 3.6 cmap indices (nle.nethack.symdef order) grouped by how the text treats them.
_CMAP_STONE = 0                         # blank: unexplored or solid rock
_CMAP_WALLS = range(1, 12)              # vertical/horizontal walls and corners
_CMAP_DOORWAY, _CMAP_OPEN_DOORS, _CMAP_CLOSED_DOORS = 12, (13, 14), (15, 16)
_CMAP_BARS, _CMAP_TREE, _CMAP_FLOOR, _CMAP_DARK_FLOOR = 17, 18, 19, 20
_CMAP_CORRIDORS = (21, 22)
_CMAP_WATER, _CMAP_ICE, _CMAP_LAVA, _CMAP_WATER2 = 32, 33, 34, 41
_CMAP_LOWERED_BRIDGE, _CMAP_RAISED_BRIDGE = (35, 36), (37, 38)
_CMAP_TRAPS = range(42, 65)
_CMAP_WALKABLE_FEATURES = tuple(range(23, 32)) + (_CMAP_ICE, 39, 40)  # stairs, altar, fountain...

# Names for the squares grouped per direction; the rest use NetHack's own explanation.
_GROUPED_CMAP_NAMES = {**{i: "wall" for i in _CMAP_WALLS}, _CMAP_BARS: "iron bars",
                       _CMAP_TREE: "tree", _CMAP_CORRIDORS[0]: "corridor",
                       _CMAP_CORRIDORS[1]: "corridor", _CMAP_WATER: "water",
                       _CMAP_WATER2: "water", _CMAP_LAVA: "molten lava"}


@dataclass(frozen=True)
class GlyphTable:
    """Per-glyph lookup arrays (length ``MAX_GLYPH``) and per-feature-code arrays.

    Attributes:
        code: glyph -> feature code (int16); 0 = not described (unexplored, lit floor, hero).
        code_key: glyph -> ``grouped << 23 | code << 3`` (int64), the code's part of the sort
            key :func:`describe` builds per square.
        walk_code: glyph -> 0 if a move onto the square is not known to be possible, 1 if it
            is, 2 for an open door (walkable, but not diagonally); uint8.
        names: feature code -> name; ``labels[code]`` adds the kind, e.g. "jackal (monster)".
        grouped: feature code -> whether it is listed as nearest-per-direction terrain.
    """

    code: np.ndarray
    code_key: np.ndarray
    walk_code: np.ndarray
    names: tuple[str, ...]
    labels: tuple[str, ...]
    grouped: np.ndarray


def _object_name(nh: Any, obj: int) -> str:
    """What an object looks like on the floor: its appearance when NetHack gives it one."""
    descr = nh.objdescr.from_idx(obj)
    cls = ord(nh.objclass(obj).oc_class)
    name, appearance = descr.oc_name, descr.oc_descr
    appearance_class = {nh.POTION_CLASS: "potion", nh.SCROLL_CLASS: "scroll",
                        nh.RING_CLASS: "ring", nh.WAND_CLASS: "wand", nh.AMULET_CLASS: "amulet",
                        nh.SPBOOK_CLASS: "spellbook", nh.GEM_CLASS: "gem"}
    if cls == nh.SCROLL_CLASS and appearance:
        return f"scroll labeled {appearance}"
    if cls in appearance_class and appearance:
        return f"{appearance} {appearance_class[cls]}"
    return name or appearance or "strange object"


@functools.lru_cache(maxsize=1)
def glyph_table() -> GlyphTable:
    """Build the glyph table from NLE's monster, object and map-symbol tables (once per process)."""
    from nle import nethack as nh

    names: list[str] = [""]
    labels: list[str] = [""]
    grouped: list[bool] = [False]
    code_of: dict[tuple[str, str, bool], int] = {}

    def feature(name: str, kind: str = KIND_TERRAIN, is_grouped: bool = False) -> int:
        key = (name, kind, is_grouped)
        if key not in code_of:
            code_of[key] = len(names)
            names.append(name)
            labels.append(f"{name} ({kind})" if kind else name)
            grouped.append(is_grouped)
        return code_of[key]

    n = nh.MAX_GLYPH
    code = np.zeros(n, dtype=np.int16)
    walk_code = np.zeros(n, dtype=np.uint8)
    for g in range(n):
        if nh.glyph_is_cmap(g):
            idx = nh.glyph_to_cmap(g)
            if idx in (_CMAP_FLOOR, _CMAP_DARK_FLOOR) or idx in _CMAP_CORRIDORS \
                    or idx == _CMAP_DOORWAY or idx in _CMAP_OPEN_DOORS \
                    or idx in _CMAP_LOWERED_BRIDGE or idx in _CMAP_WALKABLE_FEATURES \
                    or idx in _CMAP_TRAPS:
                walk_code[g] = 2 if idx in _CMAP_OPEN_DOORS else 1
            if idx in (_CMAP_STONE, _CMAP_FLOOR, _CMAP_DARK_FLOOR):
                continue
            if idx in _GROUPED_CMAP_NAMES:
                code[g] = feature(_GROUPED_CMAP_NAMES[idx], is_grouped=True)
                continue
            explanation = nh.symdef.from_idx(idx).explanation
            if not explanation:  # effects and unused slots
                continue
            code[g] = feature(explanation, KIND_TRAP if idx in _CMAP_TRAPS else KIND_TERRAIN)
        elif nh.glyph_is_pet(g):
            code[g] = feature(nh.permonst(nh.glyph_to_mon(g)).mname, KIND_PET)
        elif nh.glyph_is_monster(g):  # normal, detected and ridden monsters
            code[g] = feature(nh.permonst(nh.glyph_to_mon(g)).mname, KIND_MONSTER)
        elif nh.glyph_is_invisible(g):
            code[g] = feature("unseen monster (remembered)", KIND_MONSTER)
        elif nh.glyph_is_statue(g):
            code[g] = feature(f"statue of a {nh.permonst(g - nh.GLYPH_STATUE_OFF).mname}",
                              KIND_OBJECT)
        elif nh.glyph_is_body(g):
            code[g] = feature(f"{nh.permonst(g - nh.GLYPH_BODY_OFF).mname} corpse", KIND_OBJECT)
            walk_code[g] = 1
        elif nh.glyph_is_object(g):
            name = _object_name(nh, nh.glyph_to_obj(g))
            code[g] = feature(name, KIND_OBJECT)
            walk_code[g] = 0 if name == "boulder" else 1
        elif nh.glyph_is_warning(g):
            code[g] = feature(f"warning of a monster (level {nh.glyph_to_warning(g)})",
                              KIND_MONSTER)
    grouped_arr = np.array(grouped, dtype=bool)
    code_key = (code.astype(np.int64) << 3) | (grouped_arr[code].astype(np.int64) << 23)
    return GlyphTable(code=code, code_key=code_key, walk_code=walk_code, names=tuple(names),
                      labels=tuple(labels), grouped=grouped_arr)


def _decode_message(message: np.ndarray) -> str:
    raw = message.tobytes().split(b"\0", 1)[0]
    return raw.decode("ascii", errors="replace").strip()


def open_directions(walk_code: np.ndarray, x: int, y: int) -> list[tuple[int, int]]:
    """Known walkable squares in a straight line from (x, y), per direction.

    Args:
        walk_code: (21, 79) uint8 per square: 0 blocked or unknown, 1 walkable, 2 open door
            (walkable, but not diagonally).
        x, y: the agent's column and row.

    Returns:
        ``[(direction index, number of squares)]`` for the directions with at least one square.
    """
    # Each ray is a strided slice of the flat bytes; lstrip() counts the leading walkable run.
    flat = walk_code.tobytes()
    i = y * COLS + x
    n, e, s, w = y, COLS - 1 - x, ROWS - 1 - y, x  # squares left before each edge of the map
    rays = (
        flat[i - COLS::-COLS][:n] if n else b"",                          # north
        flat[i - COLS + 1::-(COLS - 1)][:min(n, e)] if n and e else b"",  # northeast
        flat[i + 1:i + 1 + e],                                            # east
        flat[i + COLS + 1::COLS + 1][:min(s, e)],                         # southeast
        flat[i + COLS::COLS][:s],                                         # south
        flat[i + COLS - 1::COLS - 1][:min(s, w)] if w else b"",           # southwest
        flat[i - 1::-1][:w] if w else b"",                                # west
        flat[i - COLS - 1::-(COLS + 1)][:min(n, w)] if n and w else b"",  # northwest
    )
    found = []
    for d, ray in enumerate(rays):
        count = len(ray) - len(ray.lstrip(_DIAGONAL_OK if d % 2 else _STRAIGHT_OK))
        if count:
            found.append((d, count))
    return found


_STRAIGHT_OK, _DIAGONAL_OK = b"\x01\x02", b"\x01"


def crop_map(chars: np.ndarray, x: int, y: int, rows: int = MAP_CROP_ROWS,
             cols: int = MAP_CROP_COLS) -> str:
    """ASCII map of ``rows`` x ``cols`` squares centred on the agent (clipped at the map's edge).

    Blank rows at the top and bottom and blank columns common to all rows on the left are cut.
    """
    top, left = max(0, y - rows // 2), max(0, x - cols // 2)
    window = chars[top:min(ROWS, y + rows // 2 + 1), left:min(COLS, x + cols // 2 + 1)]
    lines = [row.tobytes().decode("ascii", errors="replace").rstrip() for row in window]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    indent = min((len(line) - len(line.lstrip(" ")) for line in lines if line), default=0)
    return "\n".join(line[indent:] for line in lines)


def describe(glyphs: np.ndarray, blstats: np.ndarray, message: np.ndarray,
             chars: np.ndarray | None = None, show_map: bool = False, view: str = "full") -> str:
    """The language observation (see the module docstring for its exact form).

    Args:
        glyphs: (21, 79) int16 glyph ids.
        blstats: (27,) int64 bottom-line stats; [0] column, [1] row of the agent.
        message: (256,) uint8 NUL-terminated game message.
        chars: (21, 79) uint8 ASCII map; needed only when ``show_map``.
        show_map: append a cropped ASCII map around the agent.
        view: ``"full"`` or ``"compact"`` (see the module docstring).
    """
    if view not in VIEWS:
        raise ValueError(f"view={view!r}: use one of {', '.join(VIEWS)}.")
    compact = view == "compact"
    table = glyph_table()
    x, y = int(blstats[0]), int(blstats[1])
    codes = np.take(table.code_key, glyphs)
    codes[y, x] = 0  # the agent's own glyph
    cells = np.flatnonzero(codes)
    lines: list[tuple[int, str, str]] = []  # (nearest distance, label, text)
    if cells.size:
        # One int64 per square: distance << 24 | grouped flag << 23 | feature code << 3 |
        # direction, so that a single sort orders the squares by distance, then feature, then
        # direction.
        offsets = _CELL_OFFSET[cells] + ((ROWS - 1 - y) * (2 * COLS - 1) + (COLS - 1 - x))
        keys = np.sort(_DIST_DIR_KEY[offsets] | codes.ravel()[cells]).tolist()
        labels = table.labels
        places: dict[int, list[str]] = {}  # grouped terrain: feature code -> places
        nearest: dict[int, int] = {}
        seen: set[int] = set()
        n_single = 0
        for k in keys:
            dist, code = k >> 24, (k >> 3) & _CODE_MASK
            if k & _GROUPED_BIT:
                if compact:
                    continue
                # the nearest square of each (feature, direction) comes first in key order
                if k & _CODE_DIR_MASK in seen:
                    continue
                seen.add(k & _CODE_DIR_MASK)
                if code not in places:
                    places[code] = []
                    nearest[code] = dist
                places[code].append(_PLACES[dist][k & 7])
            else:
                n_single += 1
                if n_single <= MAX_LISTED_FEATURES:
                    lines.append((dist, labels[code], f"- {labels[code]}: {_PLACES[dist][k & 7]}"))
        if n_single > MAX_LISTED_FEATURES:
            lines.append((10**6, "", f"- ... and {n_single - MAX_LISTED_FEATURES} more"))
        for code, where in places.items():
            lines.append((nearest[code], labels[code], f"- {labels[code]}: {', '.join(where)}"))
    lines.sort(key=lambda t: (t[0], t[1]))
    out = ["You see:"] + [t[2] for t in lines] if lines else ["You see nothing of note nearby."]
    if not compact:
        opened = open_directions(np.take(table.walk_code, glyphs), x, y)
        if opened:
            out.append("Open directions: "
                       + ", ".join(f"{DIRECTIONS[d]} {n}" for d, n in opened) + ".")
        else:
            out.append("Open directions: none known.")
        out.append(f"Health: {int(blstats[_BL_HP])} of {int(blstats[_BL_HPMAX])} HP.")
    text = _decode_message(message)
    if text:
        out.append(f"Message: {text}")
    if show_map:
        if chars is None:
            raise ValueError("show_map=True needs the chars array")
        out.append("Map (you are @):\n" + crop_map(chars, x, y))
    return "\n".join(out)
