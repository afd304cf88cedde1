"""TextWorld's PDDL engine for ALFWorld games, prepared once and reset without reloading.

Playing an ALFWorld game with TextWorld (``textworld.start(path, wrappers=[AlfredDemangler(),
...])``) costs, per game and again at *every* ``reset``: parsing the game's grammar with TatSu and
translating the PDDL problem to Fast Downward's SAS format twice (once for play, once for the
planner). That is 0.65-3 s here, and each step re-parses the same grammar snippets (~0.15 s).

This module plays the very same games through TextWorld's own ``PddlEnv`` (same observations,
same admissible commands, same goal check), with the work that only depends on the game file
done once and kept:

* :class:`PreparedGame` - the parsed JSON, the grammar (``GameLogic``), the translated task and
  its SAS text; ALFWorld's demangled entity names. Built by :func:`prepare_game`.
* :class:`GameStore` - a bounded, process-wide LRU of prepared games shared by all env instances
  (the K rollouts of a GRPO group play the same game), plus one background thread that prepares
  games named ahead of time (:meth:`GameStore.prefetch`).
* :class:`AlfredGame` - a ``PddlEnv`` whose ``reset`` starts from a prepared game: it only loads
  the SAS text into its own copy of Fast Downward's library and reads the initial state.
* :func:`install_textgen_speedups` - memoizes TatSu parses of grammar snippets and conjunctive
  queries (pure functions of their text) in TextWorld's text generator, and copies derivation
  contexts shallowly.

Thread safety: TatSu parser objects and Fast Downward's translator options are module globals,
so parsing runs under :data:`PARSE_LOCK` and translation under :data:`TRANSLATE_LOCK`. Playing
(``AlfredGame.reset/step``) happens on the caller's thread with its own library copy. Code that
uses plain TextWorld PDDL games in the same process while the store prefetches should hold
both locks (as the tests do when they compare against plain TextWorld).

The translator prints progress to stdout; textworld swaps ``sys.stdout`` (process-wide) to hide
it, which would also swallow the main thread's output while a background thread translates.
Here the translator modules get a ``print`` that drops stdout-bound lines instead, and
``sys.argv`` is no longer overwritten (textworld's ``pddl2sas`` leaves it set to
``["translate.py", "domain", "task"]``).
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import copy
import io
import json
import queue
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

PARSE_LOCK = threading.RLock()
TRANSLATE_LOCK = threading.RLock()

# Fast Downward translator settings, exactly as textworld's ``fast_downward.pddl2sas`` sets them:
# unoptimized for play (keeps every operator and fact, so admissible commands are complete) and
# optimized for the planner's re-planning task.
_TRANSLATE_OPTIONS: dict[bool, dict[str, Any]] = {
    False: {"filter_unimportant_vars": False, "filter_unreachable_facts": False,
            "use_partial_encoding": False, "skip_variable_reordering": True,
            "add_implied_preconditions": False, "invariant_generation_max_candidates": 0},
    True: {"filter_unimportant_vars": True, "filter_unreachable_facts": True,
           "use_partial_encoding": True, "skip_variable_reordering": False,
           "add_implied_preconditions": True, "invariant_generation_max_candidates": 0},
}

_translator: dict[str, Any] = {}


def _print_to_files_only(*args: Any, file: Any = None, **kwargs: Any) -> None:
    """``print`` for the translator modules: their progress lines to stdout are dropped, output
    written to an explicit stream (the SAS text, warnings to stderr) is kept."""
    if file is not None and file is not sys.stdout:
        builtins.print(*args, file=file, **kwargs)


def _translator_modules() -> dict[str, Any]:
    """Import Fast Downward's translator once (caller holds TRANSLATE_LOCK)."""
    if _translator:
        return _translator
    saved_argv = sys.argv
    sys.argv = ["translate.py", "domain", "task"]  # its options module parses argv on import
    try:
        from fast_downward.translate import normalize, options, translate
        from fast_downward.translate.pddl_parser import lisp_parser, parsing_functions
    finally:
        sys.argv = saved_argv
    for name, module in list(sys.modules.items()):
        if name.startswith("fast_downward.translate") and module is not None:
            module.print = _print_to_files_only  # type: ignore[attr-defined]
    _translator.update(normalize=normalize, options=options, translate=translate,
                       lisp_parser=lisp_parser, parsing_functions=parsing_functions)
    return _translator


def translate_pddl(domain: str, problem: str, *, optimize: bool = False) -> tuple[Any, str]:
    """PDDL domain + problem -> (Fast Downward task, SAS text); same result as textworld's
    ``fast_downward.pddl2sas`` with the same ``optimize`` flag, without its side effects."""
    with TRANSLATE_LOCK:
        t = _translator_modules()
        for key, value in _TRANSLATE_OPTIONS[bool(optimize)].items():
            setattr(t["options"], key, value)
        domain_pddl = t["lisp_parser"].parse_nested_list(domain.split("\n"))
        problem_pddl = t["lisp_parser"].parse_nested_list(problem.split("\n"))
        task = t["parsing_functions"].parse_task(domain_pddl, problem_pddl)
        t["normalize"].normalize(task)
        sas_task = t["translate"].pddl_to_sas(task)
        out = io.StringIO()
        sas_task.output(out)
        return task, out.getvalue()


# -- memoized TatSu parses ---------------------------------------------------------------------
_textgen_speedups: dict[str, Any] = {}
_PARSE_CACHE_LIMIT = 200_000  # entries; cleared when full (they are small strings -> symbols)


def install_textgen_speedups() -> None:
    """Make TextWorld's PDDL text generator (``textworld.envs.pddl.textgen``) cheaper per step.

    * ``_parse_and_convert(text, rule_name=...)`` (TatSu: grammar snippet -> symbols) is
      memoized; callers set ``symbol.context`` on the result, so every call gets a deep copy.
    * ``Rule.parse_conjunctive_query(text)`` (looked up as ``textgen.Rule``) is memoized; the
      rule it returns is only read afterwards.
    * ``copy_context`` copies the context's ``variables`` and ``mapping`` dicts instead of
      deep-copying their values, which derivation only reads.

    The parses are pure functions of their text; misses parse under :data:`PARSE_LOCK`. The
    outputs are unchanged: the tests and ``experiments/alfworld_expert.py --compare-textworld``
    compare whole games against plain TextWorld. Idempotent;
    :func:`uninstall_textgen_speedups` restores TextWorld's functions.
    """
    from textworld.envs.pddl import textgen

    with PARSE_LOCK:
        if _textgen_speedups:
            return
        original_parse = textgen._parse_and_convert
        original_rule = textgen.Rule
        symbols: dict[tuple[str, str], Any] = {}
        queries: dict[str, Any] = {}

        def parse_symbols(text: str, rule_name: str = "start", **kwargs: Any) -> Any:
            if kwargs.get("trace") or set(kwargs) - {"trace"}:
                with PARSE_LOCK:
                    return original_parse(text, rule_name=rule_name, **kwargs)
            key = (text, rule_name)
            parsed = symbols.get(key)
            if parsed is None:
                with PARSE_LOCK:
                    parsed = original_parse(text, rule_name=rule_name)
                if len(symbols) >= _PARSE_CACHE_LIMIT:
                    symbols.clear()
                symbols[key] = parsed
            return copy.deepcopy(parsed)

        class CachedQueryRule(original_rule):  # type: ignore[misc, valid-type]
            """TextWorld's Rule whose conjunctive-query parser remembers what it parsed."""

            @classmethod
            def parse_conjunctive_query(cls, expr: str) -> Any:
                rule = queries.get(expr)
                if rule is None:
                    with PARSE_LOCK:
                        rule = original_rule.parse_conjunctive_query(expr)
                    if len(queries) >= _PARSE_CACHE_LIMIT:
                        queries.clear()
                    queries[expr] = rule
                return rule

        original_copy_context = textgen.copy_context

        def copy_context_shallow(context: dict[str, Any]) -> dict[str, Any]:
            # TextWorld deep-copies the variable and mapping dicts of a derivation context for
            # every symbol (80% of a step). Their values (entity infos, PDDL variables) are
            # only read during derivation; only the dicts themselves get updated, so copying
            # the dicts is enough.
            return {"state": context["state"], "facts": context["facts"],
                    "variables": dict(context["variables"]), "mapping": dict(context["mapping"]),
                    "entity_infos": context["entity_infos"]}

        textgen._parse_and_convert = parse_symbols
        textgen.Rule = CachedQueryRule
        textgen.copy_context = copy_context_shallow
        _textgen_speedups.update(module=textgen, original_parse=original_parse,
                                 original_rule=original_rule,
                                 original_copy_context=original_copy_context,
                                 symbols=symbols, queries=queries)


def uninstall_textgen_speedups() -> None:
    """Put TextWorld's own functions back (to compare against plain TextWorld)."""
    with PARSE_LOCK:
        if not _textgen_speedups:
            return
        module = _textgen_speedups["module"]
        module._parse_and_convert = _textgen_speedups["original_parse"]
        module.Rule = _textgen_speedups["original_rule"]
        module.copy_context = _textgen_speedups["original_copy_context"]
        _textgen_speedups.clear()


# -- prepared games ----------------------------------------------------------------------------
@dataclass
class PreparedGame:
    """Everything about one game file that does not change while playing it.

    Attributes:
        path: the ``game.tw-pddl`` file.
        data: its JSON (``pddl_domain``, ``grammar``, ``pddl_problem``, ``solvable``,
            ``walkthrough``).
        logic: TextWorld's ``GameLogic`` (parsed grammar and action templates).
        task, sas: the translated problem (Fast Downward task object, SAS text) for play.
        prepare_seconds: wall-clock time it took to prepare (s).
    """

    path: str
    data: dict[str, Any]
    logic: Any
    task: Any
    sas: str
    prepare_seconds: float = 0.0
    _replan_sas: str | None = field(default=None, repr=False)

    @property
    def walkthrough(self) -> list[str]:
        """The expert commands stored in the game file (ALFWorld's demangled names)."""
        return list(self.data.get("walkthrough") or [])

    def replan_sas(self) -> str:
        """The optimized SAS task the planner searches (translated on first use, ~0.5 s)."""
        if self._replan_sas is None:
            _task, self._replan_sas = translate_pddl(self.data["pddl_domain"],
                                                     self.data["pddl_problem"], optimize=True)
        return self._replan_sas


def prepare_game(path: str) -> PreparedGame:
    """Read, parse and translate one game file (the slow part; safe on a background thread)."""
    import time

    from textworld.envs.pddl import logic as pddl_logic

    start = time.perf_counter()
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    install_textgen_speedups()
    with PARSE_LOCK:
        logic = pddl_logic.GameLogic(domain=data["pddl_domain"], grammar=data["grammar"])
    task, sas = translate_pddl(data["pddl_domain"], data["pddl_problem"], optimize=False)
    return PreparedGame(path=str(path), data=data, logic=logic, task=task, sas=sas,
                        prepare_seconds=time.perf_counter() - start)


class GameStore:
    """A bounded LRU of prepared games with one background thread that prepares ahead.

    Args:
        capacity: prepared games kept (each is ~1-3 MB of Python objects and SAS text).
        prefetch_limit: games at most queued for the background thread; more are ignored.
    """

    def __init__(self, capacity: int = 64, prefetch_limit: int = 16,
                 prepare: Callable[[str], PreparedGame] = prepare_game) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}.")
        self.capacity = int(capacity)
        self.prefetch_limit = int(prefetch_limit)
        self._prepare = prepare
        self._games: OrderedDict[str, PreparedGame] = OrderedDict()
        self._pending: dict[str, Future[PreparedGame]] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[str] = queue.Queue()
        self._worker: threading.Thread | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._games)

    def __contains__(self, path: object) -> bool:
        return str(path) in self._games

    def _keep(self, path: str, game: PreparedGame) -> None:
        with self._lock:
            self._games[path] = game
            self._games.move_to_end(path)
            while len(self._games) > self.capacity:
                self._games.popitem(last=False)

    def get(self, path: str) -> PreparedGame:
        """The prepared game for ``path``: from the cache, from the background thread (waiting
        for it if it is on it), or prepared now on the calling thread."""
        path = str(path)
        with self._lock:
            game = self._games.get(path)
            if game is not None:
                self._games.move_to_end(path)
                self.hits += 1
                return game
            pending = self._pending.get(path)
            if pending is None:
                pending = Future()
                self._pending[path] = pending
            # A game still waiting in the prefetch queue is prepared here rather than behind the
            # games queued before it; one the background thread is on is waited for.
            mine = not (pending.running() or pending.done())
            if mine:
                pending.set_running_or_notify_cancel()
            self.misses += 1
        if not mine:
            return pending.result()
        return self._fulfil(path, pending)

    def _fulfil(self, path: str, pending: Future[PreparedGame]) -> PreparedGame:
        try:
            game = self._prepare(path)
        except BaseException as exc:
            pending.set_exception(exc)
            with self._lock:
                self._pending.pop(path, None)
            raise
        self._keep(path, game)
        with self._lock:
            self._pending.pop(path, None)
        pending.set_result(game)
        return game

    def prefetch(self, paths: list[str]) -> int:
        """Queue games for the background thread; returns how many were queued."""
        queued = 0
        with self._lock:
            for path in map(str, paths):
                if path in self._games or path in self._pending:
                    continue
                if len(self._pending) >= self.prefetch_limit:
                    break
                future: Future[PreparedGame] = Future()
                self._pending[path] = future
                self._queue.put(path)
                queued += 1
            if queued and (self._worker is None or not self._worker.is_alive()):
                self._worker = threading.Thread(target=self._work, name="alfworld-prefetch",
                                                daemon=True)
                self._worker.start()
        return queued

    def _work(self) -> None:
        while True:
            path = self._queue.get()
            with self._lock:
                future = self._pending.get(path)
                if future is None or future.running() or future.done():
                    continue  # get() took it over
                future.set_running_or_notify_cancel()
            with contextlib.suppress(BaseException):  # stored in the future; get() re-raises it
                self._fulfil(path, future)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or being prepared (for benchmarks and tests)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._pending.values())
            if not pending:
                return True
            for future in pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    future.exception(timeout=left)
                except concurrent.futures.TimeoutError:  # not the builtin before Python 3.11
                    return False

    def clear(self) -> None:
        with self._lock:
            self._games.clear()


_STORE: GameStore | None = None
_STORE_LOCK = threading.Lock()


def game_store() -> GameStore:
    """The process-wide store shared by every ALFWorld env instance."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None:
            _STORE = GameStore()
        return _STORE


# -- playing -----------------------------------------------------------------------------------
def _alfred_game_class() -> type:
    """Build :class:`AlfredGame` on first use (it subclasses TextWorld's PddlEnv)."""
    from textworld.core import EnvInfos, GameState
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl.pddl import PddlEnv

    class PreparedPddlState(pddl_logic.PddlState):
        """TextWorld's PddlState built from an already translated task (no translation)."""

        def __init__(self, downward_lib: Any, game: PreparedGame) -> None:
            from collections import Counter, defaultdict

            import fast_downward
            import textworld.logic
            from textworld.logic import Proposition, Variable

            # The attributes textworld.logic.State and PddlState set up, in the same order.
            self._facts = defaultdict(set)
            self._vars_by_name = {}
            self._vars_by_type = defaultdict(set)
            self._var_counts = Counter()
            self._logic = game.logic
            self.downward_lib = downward_lib
            self.pddl_problem = game.data["pddl_problem"]
            self._game = game
            self._replan_loaded = False
            self.task, self.sas = game.task, game.sas
            self._actions = {a.name: a for a in self.task.actions}
            for type_ in self.task.types:
                try:
                    self._logic.types.add(textworld.logic.Type(type_.name, type_.supertype_names))
                except ValueError:  # already known from an earlier reset
                    pass
            downward_lib.load_sas(self.sas.encode("utf-8"))
            self.name2type = {o.name: o.type_name for o in self.task.objects}

            def as_proposition(atom: Any) -> Any:
                if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
                    if atom.predicate == "=":
                        return None
                    return Proposition(atom.predicate,
                                       [Variable(arg, self.name2type[arg]) for arg in atom.args])
                if isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
                    if atom.fluent.symbol == "total-cost":
                        return None
                    name = f"{atom.expression.value}"
                    if name.isdigit():  # distances between locations are not facts
                        return None
                    return Proposition(name, [Variable(arg, self.name2type[arg])
                                              for arg in atom.fluent.args])
                return None

            self.add_facts([p for p in map(as_proposition, self.task.init) if p is not None])
            size = downward_lib.get_state_size()
            atoms = (pddl_logic.Atom * size)()
            downward_lib.get_state(atoms)
            facts = [atom.get_fact(self.name2type) for atom in atoms]
            self.add_facts([f for f in facts if not f.is_negation])

        def replan(self, infos: Any) -> list[str]:
            if not self._replan_loaded:  # the planner's task is only translated when asked for
                self.downward_lib.load_sas_replan(self._game.replan_sas().encode("utf-8"))
                self._replan_loaded = True
            return super().replan(infos)

    class AlfredGame(PddlEnv):
        """TextWorld's ``PddlEnv`` playing :class:`PreparedGame` s, with ALFWorld's entity names.

        ``use(game)`` switches games (no file I/O, no translation); ``reset()`` restarts the
        current game from its initial state; ``step(command)`` is TextWorld's.
        """

        def __init__(self) -> None:
            super().__init__(EnvInfos(won=True, admissible_commands=True))
            self._prepared: PreparedGame | None = None
            self._entity_infos = None

        def use(self, game: PreparedGame) -> None:
            if game is self._prepared:
                return
            self._prepared = game
            self._game_file = game.path
            self._game_data = game.data
            self.walkthrough = game.walkthrough
            self._logic = game.logic
            self._entity_infos = None  # named on the next reset, from the game's objects

        def _name_entities(self) -> None:
            from alfworld.agents.utils.misc import Demangler

            self._entity_infos = self._get_entity_infos()
            demangler = Demangler(game_infos=self._entity_infos, shuffle=False)
            for info in self._entity_infos.values():
                info.name = demangler.demangle_alfred_name(info.id)

        def reset(self) -> Any:
            if self._prepared is None:
                raise RuntimeError("AlfredGame.use(game) must come before reset().")
            self._pddl_state = PreparedPddlState(self.downward_lib, self._prepared)
            if self._entity_infos is None:
                self._name_entities()
            self.prev_state = None
            self.state = GameState()
            self._last_action = None
            self._moves = 0
            context = {"state": self._pddl_state, "facts": list(self._pddl_state.facts),
                       "variables": {}, "mapping": {}, "entity_infos": self._entity_infos}
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

        def planner_commands(self) -> list[str]:
            """Fast Downward's plan from the current state, as commands (~0.5 s)."""
            return self._pddl_state.replan(self._entity_infos)

        def close(self) -> None:
            # Frees the loaded task. The library copy itself stays mapped: unloading it with
            # fast_downward.close_lib (dlclose) makes the interpreter crash at exit (SIGSEGV).
            lib = getattr(self, "downward_lib", None)
            if lib is not None:
                self.downward_lib = None
                self._pddl_state = None
                lib.cleanup()

    return AlfredGame


_GAME_CLASS: list[type] = []


def new_alfred_game() -> Any:
    """A fresh :class:`AlfredGame` (its own copy of Fast Downward's library)."""
    install_textgen_speedups()
    if not _GAME_CLASS:
        _GAME_CLASS.append(_alfred_game_class())
    return _GAME_CLASS[0]()
