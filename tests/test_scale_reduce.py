"""The driver's side of a large job on bounded memory: summaries held in their serialized form
(``HeldSummary``), read back from a summaries directory, process groups held once, and the
same job JSON whichever form the reduce reads."""

from __future__ import annotations

import polars as pl
import pytest

import tracedx
from tests.conftest import SAMPLES
from tracedx.job.match import match_collectives
from tracedx.job.summary import HeldSummary, RankSummary, summarize_path

GLOO = SAMPLES / "ddp_mlp-gloo-host-straggler"


@pytest.fixture(scope="module")
def summaries() -> list[RankSummary]:
    return [summarize_path(str(GLOO / f"rank{r}.json.gz")) for r in (0, 1)]


def test_held_summary_decodes_the_same_tables_and_only_the_columns_asked(summaries, tmp_path):
    s = summaries[0]
    from_bytes = HeldSummary.from_bytes(s.to_bytes())
    from_dir = HeldSummary.read(s.write(tmp_path / "r0.rank-summary"))
    for held in (from_bytes, from_dir):
        assert held == s and held.decoded() == s
        assert held.meta == s.meta and held.steps.equals(s.steps)
        assert held.colls.height == s.colls.height > 0
        got = held.table("colls", ["start_us", "coll_type"])
        assert got.columns == ["start_us", "coll_type"]
        assert got.equals(s.colls.select("start_us", "coll_type"))
        assert held.kernels.equals(s.kernels) and held.opsig.equals(s.opsig)


def test_held_summary_cut_to_steps_cuts_its_collectives_when_decoded(summaries):
    s = summaries[0]
    held = HeldSummary.from_bytes(s.to_bytes())
    keep = s.meta["steps"][2:5]
    held.keep_steps = tuple(keep)
    assert sorted(set(held.colls["step"])) == keep
    assert held.colls.height == s.colls.filter(pl.col("step").is_in(keep)).height
    # a column subset without "step" is cut by step all the same
    assert held.table("colls", ["start_us"]).height == held.colls.height


def test_process_groups_in_meta_are_held_once_for_all_ranks(summaries):
    shared: dict = {}
    a, b = (HeldSummary.from_bytes(s.to_bytes(), shared) for s in summaries)
    pa, pb = a.meta["pg_config"], b.meta["pg_config"]
    assert pa == summaries[0].meta["pg_config"] and len(pa) >= 1
    assert all(x is y for x, y in zip(pa, pb, strict=True))  # one object per group


def test_member_rows_hold_the_group_ranks_text_once_per_group(summaries):
    m = match_collectives([HeldSummary.from_bytes(s.to_bytes()) for s in summaries])
    assert m.members.schema["pg_ranks"] == pl.Categorical
    assert m.members.schema["pg_key"] == pl.Categorical
    assert m.collectives.schema["pg_key"] == pl.Utf8  # as the JSON writes it
    by_id = dict(zip(m.collectives["coll_id"], m.collectives["pg_key"], strict=True))
    assert all(
        by_id[c] == k
        for c, k in zip(m.members["coll_id"], m.members["pg_key"].cast(pl.Utf8), strict=True)
    )
    # the same collectives as the decoded summaries give
    ref = match_collectives(summaries)
    assert ref.collectives.equals(m.collectives)
    assert ref.members.drop("pg_key", "pg_ranks").equals(m.members.drop("pg_key", "pg_ranks"))


def test_the_reduce_over_a_summaries_directory_gives_the_same_json(summaries, tmp_path, capsys):
    from tracedx.job.load import assemble_job

    paths = [str(GLOO)]
    held = [(s.meta["path"], HeldSummary.from_bytes(s.to_bytes()), None) for s in summaries]
    in_memory = tracedx.diagnose(assemble_job(held)).to_json()
    assert (
        in_memory
        == tracedx.diagnose(assemble_job([(s.meta["path"], s, None) for s in summaries])).to_json()
    )
    store = tmp_path / "sums"
    first = tracedx.load_job(paths, progress=False, workers=1, summaries_dir=store)
    assert all(isinstance(s, HeldSummary) for s in first.summaries)
    again = tracedx.load_job(paths, progress=False, workers=1, summaries_dir=store)
    assert "reused 2 of 2 rank summaries" in " ".join(capsys.readouterr().err.split())
    assert tracedx.diagnose(first).to_json() == in_memory
    assert tracedx.diagnose(again).to_json() == in_memory


def test_a_stored_summary_with_a_broken_table_is_not_reused(summaries, tmp_path):
    from tracedx.job.executor import _read_stored

    s = summaries[0]
    entry = s.write(tmp_path / "r0.rank-summary")
    assert _read_stored(str(entry), s.meta["path"]) == s
    (entry / "opsig.parquet").write_bytes(b"not parquet")  # read only when the reduce needs it
    assert _read_stored(str(entry), s.meta["path"]) is None
    with pytest.raises(ValueError, match="not a whole rank summary"):
        HeldSummary.read(entry)
