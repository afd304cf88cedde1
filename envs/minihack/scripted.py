"""A rule-based MiniHack agent that reads only the language observation.

It never looks at NLE's arrays or at ``info``: it parses the text of
:mod:`crl_bench.envs.minihack.language` and answers with an action word. That makes it a test of
the text itself (does it carry what is needed to reach the goal, and does each action word move
the way it is named?) and a cheap, deterministic stand-in policy for tests of other parts
(rollouts, trajectories, experience extraction).

Policy, in order:

1. If the goal (``staircase down`` by default) is listed, step towards it: the named direction
   first, then the directions 45 and 90 degrees either side, skipping a direction with an
   adjacent trap or one that is not listed as open (unless the goal itself is adjacent there).
   On open floor each step in the named direction brings the goal one move closer (see the
   direction rule in :mod:`~crl_bench.envs.minihack.language`).
2. Otherwise explore: keep a dead-reckoned position (the moves it made into squares the text
   listed as open) and a visit count per square; take the open direction whose next square has
   been visited least, preferring to keep going the same way, then longer open runs.
3. If nothing is listed as open, try the directions in a seeded random order.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from crl_bench.envs.minihack.language import DIRECTION_STEPS, DIRECTIONS, DISTANCE_WORDS

_FEATURE = re.compile(
    r"^- (?P<name>.+?)(?: \((?P<kind>monster|pet|trap|object)\))?: (?P<places>.+)$")
# A typical number of moves for each distance word (for choosing the nearest goal).
_DISTANCE_MOVES = {"here": 0.0, "adjacent": 1.0, "very near": 2.0, "near": 3.5, "far": 6.5,
                   "very far": 10.0}
assert set(_DISTANCE_MOVES) == set(DISTANCE_WORDS)


@dataclass(frozen=True)
class Sighting:
    """One place of one feature line: ``name (kind): distance direction``."""

    name: str
    kind: str        # "", "monster", "pet", "trap" or "object"
    distance: str    # one of DISTANCE_WORDS
    direction: str   # one of DIRECTIONS


@dataclass
class ParsedObservation:
    """What the text says, as data."""

    sightings: list[Sighting] = field(default_factory=list)
    open_runs: dict[str, int] = field(default_factory=dict)  # direction -> squares
    message: str = ""
    outcome: str = ""
    action_rejected: bool = False


def parse_observation(text: str) -> ParsedObservation:
    """Parse a MiniHack language observation.

    Raises:
        ValueError: a feature line whose place is not ``<distance word> <direction>``.
    """
    parsed = ParsedObservation()
    for line in text.splitlines():
        if line.startswith("Unknown action "):
            parsed.action_rejected = True
        elif line.startswith("- "):
            m = _FEATURE.match(line)
            if m is None or m.group("name") == "...":
                continue
            for place in m.group("places").split(", "):
                distance, _, direction = place.rpartition(" ")
                if distance not in _DISTANCE_MOVES or direction not in DIRECTIONS:
                    raise ValueError(f"unparsable place {place!r} in line {line!r}")
                parsed.sightings.append(Sighting(m.group("name"), m.group("kind") or "",
                                                 distance, direction))
        elif line.startswith("Open directions: "):
            body = line[len("Open directions: "):].rstrip(".")
            if body != "none known":
                for item in body.split(", "):
                    direction, count = item.rsplit(" ", 1)
                    parsed.open_runs[direction] = int(count)
        elif line.startswith("Message: "):
            parsed.message = line[len("Message: "):]
        elif line.startswith("Outcome: "):
            parsed.outcome = line[len("Outcome: "):]
    return parsed


def _adjacent_traps(seen: ParsedObservation) -> set[str]:
    return {s.direction for s in seen.sightings if s.kind == "trap" and s.distance == "adjacent"}


def _rotations(direction: str) -> list[str]:
    """The direction, then 45 and 90 degrees either side (8-point compass)."""
    i = DIRECTIONS.index(direction)
    return [DIRECTIONS[(i + k) % 8] for k in (0, 1, -1, 2, -2)]


class ScriptedTextAgent:
    """Reach a named feature using only the text observation.

    Args:
        goal_name: the feature to reach, as the text names it.
        seed: seed of the tie-breaking random choices.

    Call :meth:`reset` at the start of each episode, then :meth:`act` with each observation.
    """

    def __init__(self, goal_name: str = "staircase down", seed: int = 0) -> None:
        self.goal_name = goal_name
        self._rng = random.Random(seed)
        self.reset()

    def reset(self) -> None:
        self._position = (0, 0)
        self._visits: dict[tuple[int, int], int] = {(0, 0): 1}
        self._last_direction: str | None = None
        self._expected_move: tuple[int, int] | None = None

    def act(self, observation: str) -> str:
        """The next action word for this observation."""
        seen = parse_observation(observation)
        self._update_position(seen)
        move = self._towards_goal(seen) or self._explore(seen)
        if move in seen.open_runs:
            # A move into a square the text lists as open succeeds (barring monsters and
            # traps), so it is safe to dead-reckon it.
            dx, dy = DIRECTION_STEPS[DIRECTIONS.index(move)]
            self._expected_move = (dx, dy)
        else:
            self._expected_move = None
        self._last_direction = move
        return move

    # -- internals ---------------------------------------------------------------------------
    def _update_position(self, seen: ParsedObservation) -> None:
        if self._expected_move is not None and not seen.action_rejected:
            x, y = self._position
            self._position = (x + self._expected_move[0], y + self._expected_move[1])
            self._visits[self._position] = self._visits.get(self._position, 0) + 1
        self._expected_move = None

    def _towards_goal(self, seen: ParsedObservation) -> str | None:
        goals = [s for s in seen.sightings if s.name == self.goal_name]
        if not goals:
            return None
        goal = min(goals, key=lambda s: _DISTANCE_MOVES[s.distance])
        if goal.distance == "adjacent":
            return goal.direction
        traps = _adjacent_traps(seen)
        for direction in _rotations(goal.direction):
            if direction in seen.open_runs and direction not in traps:
                return direction
        return goal.direction  # nothing better known: try the straight line

    def _explore(self, seen: ParsedObservation) -> str:
        traps = _adjacent_traps(seen)
        options = [d for d in seen.open_runs if d not in traps] or list(seen.open_runs)
        if not options:
            options = list(DIRECTIONS)
            self._rng.shuffle(options)
            return options[0]
        x, y = self._position

        def cost(direction: str) -> tuple[int, int, int, float]:
            dx, dy = DIRECTION_STEPS[DIRECTIONS.index(direction)]
            return (self._visits.get((x + dx, y + dy), 0),
                    0 if direction == self._last_direction else 1,
                    -seen.open_runs.get(direction, 0),
                    self._rng.random())

        return min(options, key=cost)


@dataclass(frozen=True)
class EpisodeResult:
    success: bool
    actions: int
    total_reward: float
    final_observation: str


def play_episode(env: object, agent: ScriptedTextAgent, seed: int | None = None,
                 options: dict | None = None) -> EpisodeResult:
    """Play one episode of a text env with the scripted agent (it sees only the observations)."""
    obs, info = env.reset(seed=seed, options=options)  # type: ignore[attr-defined]
    agent.reset()
    actions, total = 0, 0.0
    while True:
        step = env.step(agent.act(obs))  # type: ignore[attr-defined]
        obs, reward, terminated, truncated, info = step
        actions += 1
        total += float(reward)
        if terminated or truncated:
            return EpisodeResult(bool(info["success"]), actions, total, obs)


def success_rate(env: object, episodes: int, first_seed: int = 0, agent_seed: int = 0) -> float:
    """Fraction of ``episodes`` seeded episodes (seeds ``first_seed``...) the agent solves."""
    agent = ScriptedTextAgent(seed=agent_seed)
    wins = sum(play_episode(env, agent, seed=first_seed + i).success for i in range(episodes))
    return wins / episodes
