"""Generate (or check) the ``mini`` SWE task set: repair tasks on the handykit library.

Each task is written here as a bug to put into the clean library (``repo/`` under
``envs/swe/data/mini``), tests that catch it, and an issue text. The script derives the
SWE-bench fields from them and checks every task for real:

* ``patch`` (gold) = the diff from the buggy base back to the clean library;
* ``test_patch`` = the new tests appended to the module's test file;
* the tests are run with pytest on the base + test patch and on base + gold + test patch;
  ``FAIL_TO_PASS`` = tests failing before and passing after, ``PASS_TO_PASS`` = passing in
  both. Every new test must be in ``FAIL_TO_PASS`` and nothing may fail after the gold patch;
* ``base_commit`` = the hash of the one-commit repository the env builds for the task.

Usage::

    python scripts/swe_make_mini.py          # rewrite tasks.jsonl and splits.json
    python scripts/swe_make_mini.py --check  # verify that the files match (exit 1 if not)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from crl_bench.envs.swe import workspaces as ws
from crl_bench.envs.swe.grading import PASSING, parse_pytest_log
from crl_bench.envs.swe.tasks import MINI_DIR

REPO = "crl-bench/handykit"

# Each spec: id, split, the module file, [(clean text, buggy text)], the test file, the tests
# the test patch appends, and the issue.
SPECS: list[dict] = [
    {
        "id": 101, "split": "train", "file": "handykit/text.py",
        "bug": [('''    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    return sep.join(words)
''', '''    return re.sub(r"[^a-z0-9]", sep, ascii_text.lower())
''')],
        "test_file": "tests/test_text.py",
        "tests": '''

def test_slugify_collapses_runs_of_separators():
    assert slugify("Hello,  World!") == "hello-world"
    assert slugify("  --Already--slugged--  ") == "already-slugged"


def test_slugify_only_punctuation():
    assert slugify("?!") == ""
''',
        "issue": '''slugify() leaves repeated and trailing dashes

`slugify("Hello,  World!")` returns `'hello---world-'`. The docstring promises that every run of
characters that are not letters or digits becomes a single separator and that the slug never
starts or ends with the separator, so I expected `'hello-world'`.

Leading spaces show the same problem: `slugify("  Spaced out  ")` gives `'--spaced-out--'`.
''',
    },
    {
        "id": 102, "split": "train", "file": "handykit/text.py",
        "bug": [('''    return text[: width - len(ellipsis)] + ellipsis
''', '''    return text[:width] + ellipsis
''')],
        "test_file": "tests/test_text.py",
        "tests": '''

def test_truncate_result_fits_width():
    assert truncate("abcdefghij", 8) == "abcde..."
    assert len(truncate("a" * 50, 10)) == 10


def test_truncate_custom_ellipsis():
    assert truncate("abcdefghij", 5, ellipsis="\\u2026") == "abcd\\u2026"
''',
        "issue": '''truncate() returns strings longer than the requested width

```python
>>> from handykit.text import truncate
>>> truncate("abcdefghij", 8)
'abcdefgh...'
```

That is 11 characters. `width` should be the maximum length of the result, ellipsis included,
as in the docstring example (`'abcde...'`).
''',
    },
    {
        "id": 103, "split": "test", "file": "handykit/text.py",
        "bug": [('''    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\\1_\\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\\1_\\2", name)
''', '''    name = re.sub(r"([a-z0-9])([A-Z])", r"\\1_\\2", name)
''')],
        "test_file": "tests/test_text.py",
        "tests": '''

@pytest.mark.parametrize("name, expected", [
    ("HTTPServer", "http_server"),
    ("parseHTTPResponse", "parse_http_response"),
    ("XMLToJSON", "xml_to_json"),
])
def test_snake_case_keeps_acronyms_together(name, expected):
    assert snake_case(name) == expected
''',
        "issue": '''snake_case() glues acronyms to the following word

`snake_case("HTTPServer")` gives `'httpserver'` and `snake_case("parseHTTPResponse")` gives
`'parse_httpresponse'`. The docstring says runs of capitals are kept together as one word, so
these should be `'http_server'` and `'parse_http_response'`.
''',
    },
    {
        "id": 104, "split": "train", "file": "handykit/intervals.py",
        "bug": [('''            merged[-1] = Interval(last.start, max(last.end, iv.end))
''', '''            merged[-1] = Interval(last.start, iv.end)
''')],
        "test_file": "tests/test_intervals.py",
        "tests": '''

def test_merge_keeps_enclosing_interval():
    assert merge_intervals([Interval(0, 10), Interval(2, 3)]) == [Interval(0, 10)]


def test_total_length_with_nested_interval():
    assert total_length([Interval(0, 10), Interval(2, 3), Interval(4, 12)]) == 12
''',
        "issue": '''merge_intervals() shrinks an interval that contains a later one

```python
>>> merge_intervals([Interval(0, 10), Interval(2, 3)])
[Interval(start=0, end=3)]
```

The part from 3 to 10 is lost; the result should be `[Interval(start=0, end=10)]`.
`total_length()` is wrong for such inputs too.
''',
    },
    {
        "id": 105, "split": "train", "file": "handykit/intervals.py",
        "bug": [('''        return self.start < other.end and other.start < self.end
''', '''        return self.start <= other.end and other.start <= self.end
''')],
        "test_file": "tests/test_intervals.py",
        "tests": '''

def test_adjacent_intervals_do_not_overlap():
    assert not Interval(1, 3).overlaps(Interval(3, 5))
    assert not Interval(3, 5).overlaps(Interval(1, 3))


def test_adjacent_intervals_have_no_intersection():
    assert Interval(1, 3).intersection(Interval(3, 5)) is None
''',
        "issue": '''Interval.overlaps() reports adjacent intervals as overlapping

Intervals are half-open (`[start, end)`), so `Interval(1, 3)` and `Interval(3, 5)` share no
point. Still `Interval(1, 3).overlaps(Interval(3, 5))` is `True`, and
`Interval(1, 3).intersection(Interval(3, 5))` returns `Interval(start=3, end=3)` instead of
`None`.
''',
    },
    {
        "id": 106, "split": "train", "file": "handykit/stats.py",
        "bug": [('''    s = sorted(_require_data(xs))
    mid = len(s) // 2
''', '''    s = _require_data(xs)
    mid = len(s) // 2
''')],
        "test_file": "tests/test_stats.py",
        "tests": '''

def test_median_unsorted_input():
    assert median([3, 1, 2]) == 2
    assert median([10, 2, 38, 23, 38, 23, 21]) == 23
    assert median([4, 1, 3, 2]) == 2.5
''',
        "issue": '''median() is wrong for unsorted data

`median([3, 1, 2])` returns `1` instead of `2`. It seems to work only when the input is
already sorted.
''',
    },
    {
        "id": 107, "split": "train", "file": "handykit/stats.py",
        "bug": [('''    return sum((x - m) ** 2 for x in xs) / (len(xs) - ddof)
''', '''    return sum((x - m) ** 2 for x in xs) / len(xs)
''')],
        "test_file": "tests/test_stats.py",
        "tests": '''

def test_sample_variance_is_the_default():
    assert variance([1, 2, 3, 4]) == pytest.approx(5 / 3)
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(math.sqrt(32 / 7))
''',
        "issue": '''variance() ignores ddof

`variance([1, 2, 3, 4])` returns `1.25`, the population variance, although the default
`ddof=1` should give the sample variance `1.6667`. `stdev()` has the same problem since it
uses `variance()`.
''',
    },
    {
        "id": 108, "split": "test", "file": "handykit/stats.py",
        "bug": [('''    hi = min(lo + 1, len(s) - 1)
''', '''    hi = lo + 1
''')],
        "test_file": "tests/test_stats.py",
        "tests": '''

def test_percentile_100_is_the_maximum():
    assert percentile([15, 20, 35, 40, 50], 100) == 50


def test_percentile_of_one_value():
    assert percentile([7], 50) == 7
''',
        "issue": '''percentile() raises IndexError for p=100

```python
>>> percentile([15, 20, 35, 40, 50], 100)
IndexError: list index out of range
```

It should return the maximum (50), as documented. A list with a single value fails for every p.
''',
    },
    {
        "id": 109, "split": "train", "file": "handykit/roman.py",
        "bug": [('''        if i + 1 < len(s) and value < _VALUES[s[i + 1]]:
            total -= value
        else:
            total += value
''', '''        total += value
''')],
        "test_file": "tests/test_roman.py",
        "tests": '''

@pytest.mark.parametrize("numeral, n", [("IV", 4), ("IX", 9), ("XIV", 14), ("MCMXCIV", 1994),
                                        ("mmxxiv", 2024)])
def test_from_roman_subtractive(numeral, n):
    assert from_roman(numeral) == n


def test_round_trip():
    for n in range(1, 400):
        assert from_roman(to_roman(n)) == n
''',
        "issue": '''from_roman() rejects numerals with subtractive notation

`from_roman("IX")` raises `ValueError: invalid Roman numeral: 'IX'`, and so does
`from_roman("MCMXCIV")`. Purely additive numerals such as `"VIII"` work. Since `to_roman()`
produces these numerals, `from_roman(to_roman(n))` fails for n = 4, 9, 14, ...
''',
    },
    {
        "id": 110, "split": "train", "file": "handykit/semver.py",
        "bug": [('''        pre = (1,) if not self.prerelease else (0, tuple(_identifier_key(i) for i in self.prerelease))
        return (self.major, self.minor, self.patch, pre)
''', '''        return (self.major, self.minor, self.patch, self.prerelease)
''')],
        "test_file": "tests/test_semver.py",
        "tests": '''

def test_prerelease_sorts_before_release():
    assert Version.parse("1.0.0-alpha") < Version.parse("1.0.0")
    assert Version.parse("1.0.0") > Version.parse("1.0.0-rc.1")


def test_precedence_example_from_the_semver_spec():
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]
    versions = [Version.parse(v) for v in chain]
    assert sorted(reversed(versions)) == versions
''',
        "issue": '''Pre-releases compare greater than the release

`Version.parse("1.0.0-alpha") < Version.parse("1.0.0")` is `False`, but semver.org says
1.0.0-alpha < 1.0.0. Pre-release identifiers also compare as strings: 1.0.0-beta.11 sorts before
1.0.0-beta.2.

Expected precedence (semver.org, item 11): 1.0.0-alpha < 1.0.0-alpha.1 < 1.0.0-alpha.beta <
1.0.0-beta < 1.0.0-beta.2 < 1.0.0-beta.11 < 1.0.0-rc.1 < 1.0.0.
''',
    },
    {
        "id": 111, "split": "test", "file": "handykit/semver.py",
        "bug": [('''            return Version(self.major, self.minor + 1, 0)
''', '''            return Version(self.major, self.minor + 1, self.patch)
''')],
        "test_file": "tests/test_semver.py",
        "tests": '''

def test_bump_minor_resets_patch():
    assert str(Version.parse("1.2.3").bump("minor")) == "1.3.0"
    assert str(Version.parse("0.9.7-beta+build.1").bump("minor")) == "0.10.0"
''',
        "issue": '''Version.bump("minor") keeps the patch number

`Version.parse("1.2.3").bump("minor")` gives `1.3.3`. The docstring says lower parts reset to 0,
so it should be `1.3.0`.
''',
    },
    {
        "id": 112, "split": "train", "file": "handykit/lru.py",
        "bug": [('''        self._data.move_to_end(key)
        self.hits += 1
''', '''        self.hits += 1
''')],
        "test_file": "tests/test_lru.py",
        "tests": '''

def test_get_marks_key_as_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "a" in cache
    assert "b" not in cache
    assert cache.keys() == ["a", "c"]
''',
        "issue": '''LRUCache evicts entries that were just read

With a cache of capacity 2: `put("a", 1)`, `put("b", 2)`, `get("a")`, `put("c", 3)` evicts
`"a"`, although `"b"` is the least recently used entry. The class docstring says that `get`
counts as a use of the key.
''',
    },
    {
        "id": 113, "split": "test", "file": "handykit/lru.py",
        "bug": [('''    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)
            self.evictions += 1
''', '''    def put(self, key, value):
        if len(self._data) >= self.capacity:
            self._data.popitem(last=False)
            self.evictions += 1
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
''')],
        "test_file": "tests/test_lru.py",
        "tests": '''

def test_updating_a_key_in_a_full_cache_evicts_nothing():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("b", 20)
    assert cache.keys() == ["a", "b"]
    assert cache.get("b") == 20
    assert cache.evictions == 0


def test_update_makes_key_most_recent():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"]
    assert cache.evictions == 1
''',
        "issue": '''Updating a key in a full LRUCache evicts another entry

With capacity 2, `put("a", 1)`, `put("b", 2)`, `put("b", 20)` drops `"a"`, leaving only `"b"`.
Nothing should be evicted when the key is already in the cache, and `evictions` should stay 0.
''',
    },
    {
        "id": 114, "split": "train", "file": "handykit/graph.py",
        "bug": [('''    if len(order) != len(nodes):
        raise CycleError(n for n in nodes if pending[n])
    return order
''', '''    return order
''')],
        "test_file": "tests/test_graph.py",
        "tests": '''

def test_cycle_is_reported():
    import pytest

    from handykit.graph import CycleError

    with pytest.raises(CycleError) as err:
        topological_sort({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})
    assert err.value.nodes == ["a", "b", "c"]


def test_self_dependency_is_a_cycle():
    import pytest

    from handykit.graph import CycleError

    with pytest.raises(CycleError):
        topological_sort({"a": ["a"]})
''',
        "issue": '''topological_sort() silently drops nodes in a cycle

`topological_sort({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})` returns `['d']` instead of
raising. The docstring says `CycleError` is raised, and `CycleError.nodes` should list the nodes
that could not be ordered (here a, b and c).
''',
    },
    {
        "id": 115, "split": "train", "file": "handykit/querystring.py",
        "bug": [('''from urllib.parse import quote_plus, unquote_plus
''', '''from urllib.parse import quote_plus, unquote
'''), ('''        key, value = unquote_plus(key), unquote_plus(value)
''', '''        key, value = unquote(key), unquote(value)
''')],
        "test_file": "tests/test_querystring.py",
        "tests": '''

def test_plus_decodes_to_space():
    assert parse_qs("q=hello+world&x=a%2Bb") == {"q": ["hello world"], "x": ["a+b"]}


def test_round_trip_with_spaces():
    params = {"full name": ["Ada Lovelace"], "q": ["1 + 1"]}
    assert parse_qs(encode_qs(params)) == params
''',
        "issue": '''parse_qs() does not decode "+" as a space

`parse_qs("q=hello+world")` returns `{'q': ['hello+world']}`. Query strings made by
`encode_qs()` (and by HTML forms) use `+` for spaces, so `parse_qs(encode_qs({"q": "a b"}))`
does not give back `{"q": ["a b"]}`.
''',
    },
    {
        "id": 116, "split": "train", "file": "handykit/money.py",
        "bug": [('''    return [from_cents(base + (1 if i < remainder else 0)) for i in range(parts)]
''', '''    return [from_cents(base) for _ in range(parts)]
''')],
        "test_file": "tests/test_money.py",
        "tests": '''

def test_split_distributes_the_remainder():
    parts = split_amount("10.00", 3)
    assert parts == [Decimal("3.34"), Decimal("3.33"), Decimal("3.33")]
    assert sum(parts) == Decimal("10.00")


def test_split_small_amount():
    assert split_amount("0.05", 3) == [Decimal("0.02"), Decimal("0.02"), Decimal("0.01")]
''',
        "issue": '''split_amount() loses cents

`split_amount("10.00", 3)` returns `[3.33, 3.33, 3.33]`, which adds up to 9.99. The parts must
add up to the total exactly and differ by at most one cent, larger parts first
(3.34, 3.33, 3.33).
''',
    },
    {
        "id": 117, "split": "train", "file": "handykit/iterutils.py",
        "bug": [('''        chunk = list(islice(it, size))
        if not chunk:
            return
''', '''        chunk = list(islice(it, size))
        if len(chunk) < size:
            return
''')],
        "test_file": "tests/test_iterutils.py",
        "tests": '''

def test_chunked_keeps_the_short_last_chunk():
    assert list(chunked(range(5), 2)) == [[0, 1], [2, 3], [4]]
    assert list(chunked("abc", 5)) == [["a", "b", "c"]]
''',
        "issue": '''chunked() drops the last, shorter chunk

`list(chunked(range(5), 2))` gives `[[0, 1], [2, 3]]`: the 4 is lost. The docstring says the last
list may be shorter.
''',
    },
    {
        "id": 118, "split": "test", "file": "handykit/inifile.py",
        "bug": [('''def _split_pair(line):
    # The key ends at the first separator; the value may contain '=' or ':' itself.
    positions = [p for p in (line.find("="), line.find(":")) if p >= 0]
    if not positions:
        return None
    cut = min(positions)
    return line[:cut], line[cut + 1:]
''', '''def _split_pair(line):
    for sep in ("=", ":"):
        if sep in line:
            key, _, value = line.rpartition(sep)
            return key, value
    return None
''')],
        "test_file": "tests/test_inifile.py",
        "tests": '''

def test_values_may_contain_separators():
    text = "[links]\\nhome = https://example.org/?a=1&b=2\\nstart: 09:30\\nratio = 16:9\\n"
    assert parse_ini(text) == {"links": {"home": "https://example.org/?a=1&b=2",
                                         "start": "09:30", "ratio": "16:9"}}
''',
        "issue": '''parse_ini() mangles values that contain "=" or ":"

A line is split at the last separator instead of the first:
`url = https://example.org/?a=1` gives the key `url = https://example.org/?a` with the value
`1`, and `start: 09:30` gives the key `start: 09` with the value `30`. Keys end at the first
separator; values may contain separators.
''',
    },
]


def _pytest(directory: Path, test_file: str) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
                           test_file], cwd=directory, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(directory),
                               "PYTHONDONTWRITEBYTECODE": "1"})
    statuses = parse_pytest_log(proc.stdout)
    if not statuses:
        raise SystemExit(f"pytest produced no results in {directory}:\n{proc.stdout[-3000:]}")
    return statuses


def build_task(spec: dict) -> tuple[dict, str]:
    iid = f"handykit__handykit-{spec['id']}"
    with tempfile.TemporaryDirectory(prefix="swe-mini-") as tmp:
        base = Path(tmp) / "base"
        ws.copy_tree(MINI_DIR / "repo", base)
        module = base / spec["file"]
        clean_text = module.read_text()
        buggy = clean_text
        for clean, bug in spec["bug"]:
            if buggy.count(clean) != 1:
                raise SystemExit(f"{iid}: the clean text occurs {buggy.count(clean)} times in "
                                 f"{spec['file']} (must be once):\n{clean}")
            buggy = buggy.replace(clean, bug)
        module.write_text(buggy)
        ws.commit_tree(base, "scratch")
        module.write_text(clean_text)
        gold = ws.git(["diff"], base).stdout
        ws.git(["checkout", "-q", "--", "."], base)
        test_path = base / spec["test_file"]
        test_path.write_text(test_path.read_text() + spec["tests"].lstrip("\n").join(["\n\n", ""]))
        test_patch = ws.git(["diff"], base).stdout
        ws.git(["checkout", "-q", "--", "."], base)

        ws.apply_patch(base, test_patch)
        before = _pytest(base, spec["test_file"])
        ws.apply_patch(base, gold)
        after = _pytest(base, spec["test_file"])
        failing_after = sorted(t for t, s in after.items() if s not in PASSING)
        if failing_after:
            raise SystemExit(f"{iid}: tests fail with the gold patch: {failing_after}")
        f2p = sorted(t for t in after if before.get(t) not in PASSING)
        p2p = sorted(t for t in after if before.get(t) in PASSING)
        new_names = {line.split("(")[0][4:] for line in spec["tests"].splitlines()
                     if line.startswith("def test_")}
        stale = sorted(t for t in p2p if t.split("::")[1].split("[")[0] in new_names)
        if not f2p or stale:
            raise SystemExit(f"{iid}: new tests must fail before the fix: F2P={f2p}, "
                             f"new tests passing before={stale}")

        # The base commit exactly as the env builds it (tasks.MiniTaskSet.local_runtime).
        rebuilt = Path(tmp) / "rebuilt"
        ws.copy_tree(MINI_DIR / "repo", rebuilt)
        ws.apply_patch(rebuilt, gold, reverse=True)
        base_commit = ws.commit_tree(rebuilt, f"{REPO} at {iid} base")

    record = {
        "instance_id": iid, "repo": REPO, "base_commit": base_commit,
        "problem_statement": spec["issue"], "patch": gold, "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p), "version": "1.0",
        "hints_text": "", "created_at": f"2024-05-{spec['id'] - 100:02d}T12:00:00Z",
        "environment_setup_commit": base_commit,
    }
    return record, spec["split"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only verify that tasks.jsonl and splits.json are up to date")
    args = parser.parse_args(argv)
    records, splits = [], {"train": [], "test": []}
    for spec in SPECS:
        record, split = build_task(spec)
        records.append(record)
        splits[split].append(record["instance_id"])
        f2p = json.loads(record["FAIL_TO_PASS"])
        p2p = json.loads(record["PASS_TO_PASS"])
        print(f"{record['instance_id']:<26} {split:<5} F2P {len(f2p):>2}  P2P {len(p2p):>2}  "
              f"base {record['base_commit'][:10]}")
    tasks_text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    splits_text = json.dumps(splits, indent=1) + "\n"
    tasks_file, splits_file = MINI_DIR / "tasks.jsonl", MINI_DIR / "splits.json"
    if args.check:
        ok = (tasks_file.exists() and tasks_file.read_text() == tasks_text
              and splits_file.exists() and splits_file.read_text() == splits_text)
        print("up to date" if ok else "OUT OF DATE: run scripts/swe_make_mini.py")
        return 0 if ok else 1
    tasks_file.write_text(tasks_text)
    splits_file.write_text(splits_text)
    print(f"wrote {len(records)} tasks to {tasks_file} ({len(splits['train'])} train, "
          f"{len(splits['test'])} test)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
