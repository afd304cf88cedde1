"""An extraction answer whose memory text is empty, under ``paper`` and under the CPU presets.

Official (ComplementaryRL ab2574f, ``roll/pipeline/agentic/memory/async_memory_manager.py``):
the launch config sets ``memory_format_pattern: null``
(``examples/singletask-agentic/single_task_complementaryrl.yaml:195``), so
``validate_memory_format`` passes any string (:1153-1155) and the parser keeps an ``add`` whose
``new_memory`` is ``""`` (:1238-1245); ``_execute_functional_operations`` strips it
(``_normalize_memory_text``, :1052) and stores it as a new entry with that empty value
(:1873-1901; the value is read back as it is, ``memory_type/case_base.py:100-102``, and shown as
it is, :283-284). So officially the answer is not malformed and the bank gains one entry with no
text. The CPU presets' parser (``extraction_style=short``) keeps refusing it (malformed).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from crl_bench.baselines.comp_rl import AGENT as COMP_RL  # noqa: E402
from crl_bench.experience.bank import ExperienceBank  # noqa: E402
from crl_bench.experience.manager import ExperienceManager, RetrievalConfig  # noqa: E402
from crl_bench.extractor.track import ExtractorTrack  # noqa: E402
from crl_bench.config.schema import PRESETS, ExtractorConfig  # noqa: E402
from tests.test_extractor_track import FixedAnswers, embedder, trajectory  # noqa: E402,F401

EMPTY = '<answer>[{"function_name": "add", "parameters": {"new_memory": "  "}}]</answer>'


def run_extraction(tmp_path, embedder, style: str):  # noqa: F811
    bank = ExperienceBank(tmp_path / f"{style}.sqlite", dim=embedder.dim,
                          embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig(diversify=False))
    cfg = ExtractorConfig(answer_template="free", extraction_style=style)
    track = ExtractorTrack(manager, FixedAnswers([EMPTY]), None, cfg, temperature=1.0,
                           merge_every=0, merge_chunk=5, extractor_step=COMP_RL.extractor_step,
                           asynchronous=False, log=lambda m: None)
    track.submit(1, [trajectory("Reach the stairs down.", True)])
    return track, manager


def test_paper_stores_an_empty_memory_text_as_officially(tmp_path, embedder):  # noqa: F811
    assert PRESETS["paper"]().extractor.extraction_style == "official"
    track, manager = run_extraction(tmp_path, embedder, "official")
    try:
        assert track.stats["malformed"] == 0 and track.stats["ops_applied"] == 1
        (entry,) = manager.bank.get(manager.bank.all_ids())
        assert (entry.title, entry.content, entry.render()) == ("", "", "")
        (sample,) = track.samples
        assert not sample.malformed and sample.entry_ids == [entry.id]
    finally:
        manager.bank.close()


@pytest.mark.parametrize("preset", ["tiny", "cpu"])
def test_cpu_presets_keep_refusing_it(tmp_path, embedder, preset):  # noqa: F811
    style = PRESETS[preset]().extractor.extraction_style
    assert style == "short"
    track, manager = run_extraction(tmp_path, embedder, style)
    try:
        assert track.stats["malformed"] == 1 and manager.bank.all_ids() == []
    finally:
        manager.bank.close()
