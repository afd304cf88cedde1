"""The follow probe's bar for an actor that reads (experiments/minihack_landmark.py
``reader_bar``, ``follow-table``), and the random entries it shows: drawn from the probe's seed and
the level, independent of the level's rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from minihack_landmark import claimed_move, follow_table, reader_bar, share  # noqa: E402


def _rows(take: int, avoid: int, top: int, success: int, n: int = 128):
    return [{"example": "placeholder", "claim": "take_random", "sent_claim": share(take, n),
             "success": share(20, n), "valid_move": share(n, n), "top_move": share(30, n),
             "top_moves": [["north", 30]], "sent_example": share(0, n),
             "moves": {"north": 30, "east": 28, "(other)": 70}},
            {"example": "placeholder", "claim": "avoid_random", "sent_claim": share(avoid, n),
             "success": share(18, n), "valid_move": share(n, n), "top_move": share(30, n),
             "top_moves": [["east", 30]]},
            {"example": "placeholder", "claim": "none", "sent_claim": None,
             "success": share(success, n), "valid_move": share(n, n), "top_move": share(top, n),
             "top_moves": [["south", top]]}]


def test_the_bar_holds_only_when_every_criterion_does():
    assert reader_bar(_rows(90, 6, 51, 16))["passes"]          # 0.70, 0.047, 0.398, at the floor
    assert not reader_bar(_rows(89, 6, 51, 16))["passes"]      # M sent in 69.5%
    assert not reader_bar(_rows(90, 7, 51, 16))["passes"]      # X sent in 5.5%
    assert not reader_bar(_rows(90, 6, 52, 16))["passes"]      # one move in 40.6%
    bar = reader_bar(_rows(90, 6, 51, 30))                      # 30/128: Wilson low 0.17 > 1/8
    assert not bar["passes"] and not bar["none_success_at_floor"]["holds"]
    assert not reader_bar(_rows(90, 6, 51, 16)[:2])["passes"]   # no "none" row: not measured


def test_random_entries_are_independent_of_the_rule():
    from crl_bench.envs.minihack.landmark import landmark_layout

    levels = range(1_000_000, 1_000_512)
    for claim in ("take_random", "avoid_random"):
        moves = [claimed_move(claim, lv, 0) for lv in levels]
        assert moves == [claimed_move(claim, lv, 0) for lv in levels]  # seeded
        hits = sum(m == landmark_layout(lv)[2] for m, lv in zip(moves, levels))
        assert 40 <= hits <= 90  # 512/8 = 64 expected; far from always / never the rule
        assert len(set(moves)) == 8
    assert all(claimed_move("right", lv, 0) == landmark_layout(lv)[2] for lv in levels)
    assert claimed_move("none", 1_000_000, 0) is None


def test_follow_table_lists_each_row_and_the_bar(tmp_path):
    rows = _rows(100, 2, 40, 15)
    data = {"model": "smollm2-135m-reader", "model_folder": "smollm2-135m-reader-v4-s0", "follow": {
        "temperature": 0.0, "rows": rows, "reader_bar": {"placeholder": reader_bar(rows)}}}
    path = tmp_path / "f.json"
    path.write_text(json.dumps(data))
    text = follow_table([path])
    # the actor is named with its model folder, which carries the version
    assert ("| smollm2-135m-reader [smollm2-135m-reader-v4-s0] | 0 | placeholder | take M (M random) "
            "| 20/128 = 0.16") in text
    assert "0/128 = 0.00 [0.00, 0.03] | 100/128 = 0.78 [0.70, 0.84] | north: 30/128" in text
    assert "100/128 = 0.78 [0.70, 0.84]" in text
    assert "smollm2-135m-reader [smollm2-135m-reader-v4-s0], temperature 0, example placeholder: " \
        "**passes**" in text
    data.pop("model_folder")  # older files: the file's name stands in
    path.write_text(json.dumps(data))
    assert "| smollm2-135m-reader [f.json] | 0 |" in follow_table([path])
