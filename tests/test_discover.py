"""Inputs to a job (files, folders, globs, URLs) and the rank-set checks, each with its note."""

from __future__ import annotations

import os

import pytest

from tracedx.errors import TraceError
from tracedx.job.discover import (
    expand_inputs,
    rank_from_filename,
    resolve_ranks,
)


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path


def test_directory_is_searched_recursively_for_traces_only(tmp_path):
    a = _touch(tmp_path / "iteration_10" / "rank0_trace.json")
    b = _touch(tmp_path / "iteration_10" / "rank1_trace.json.gz")
    c = _touch(tmp_path / "host_12.1700000000.pt.trace.json")
    _touch(tmp_path / "notes.txt")
    _touch(tmp_path / ".tracedx-abc.json")  # a capture's temporary file
    _touch(tmp_path / ".hidden" / "rank5.json")
    assert expand_inputs([tmp_path]) == sorted(map(str, [a, b, c]))


def test_rank_summary_folders_are_not_traces(tmp_path):
    """A --summaries folder inside the job folder: its *.rank-summary/meta.json is no trace."""
    a = tmp_path / "rank0.json"
    a.write_text("{}")
    s = tmp_path / "sums" / "rank0.json.rank-summary"
    s.mkdir(parents=True)
    (s / "meta.json").write_text("{}")
    assert expand_inputs([tmp_path]) == [str(a)]


def test_files_globs_urls_and_repeats(tmp_path):
    a = _touch(tmp_path / "rank-0.json")
    b = _touch(tmp_path / "rank-1.json")
    _touch(tmp_path / "other.json")
    # a quoted glob is expanded by tracedx; the same file named twice is kept once
    got = expand_inputs([str(tmp_path / "rank-*.json"), str(a)])
    assert got == [str(a), str(b)]
    assert expand_inputs([str(b), str(a)]) == [str(b), str(a)]
    assert expand_inputs(["s3://bucket/job/rank0.json"]) == ["s3://bucket/job/rank0.json"]
    assert expand_inputs([str(tmp_path / "**" / "rank-1.json")]) == [str(b)]
    # a glob matching folders searches them, as naming each folder would
    c = _touch(tmp_path / "run1" / "rank0.json")
    d = _touch(tmp_path / "run2" / "sub" / "rank0.json.gz")
    assert expand_inputs([str(tmp_path / "run*")]) == [str(c), str(d)]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: [], "no trace given"),
        (lambda p: [p / "nope.json"], "no such file or directory"),
        (lambda p: [str(p / "x*.json")], "no file or directory of traces matches this pattern"),
        (lambda p: [p], "no trace files"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, make, message):
    with pytest.raises(TraceError, match=message) as e:
        expand_inputs(make(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "name, rank",
    [
        ("iteration_3/rank7_trace.json", 7),
        ("rank-0.json", 0),
        ("train-20261201-092751-rank12.json.gz", 12),
        ("trace_filter__sampled_rank-1.json.gz", 1),
        ("RANK_3.json", 3),
        ("rank3/trace.json", 3),
        ("frank1.json", None),
        ("host_1234.1700000000000.pt.trace.json", None),
        ("worker.json", None),
    ],
)
def test_rank_from_filename(name, rank):
    assert rank_from_filename(os.path.join("/data", name)) == rank


def _meta(rank=None, world=None, steps=(1, 2, 3), source="distributedInfo", **kw):
    return {
        "rank": rank,
        "rank_source": source if rank is not None else None,
        "world_size": world,
        "steps": list(steps),
        **kw,
    }


def test_clean_job_has_no_notes_and_ignores_input_order():
    entries = [("/j/b.json", _meta(1, 2)), ("/j/a.json", _meta(0, 2))]
    rs = resolve_ranks(entries)
    assert rs.ranks == (0, 1)
    assert rs.index == {0: 1, 1: 0}
    assert rs.paths == {0: "/j/a.json", 1: "/j/b.json"}
    assert rs.world_size == 2 and rs.steps == (1, 2, 3) and rs.notes == ()
    assert resolve_ranks(entries[::-1]).paths == rs.paths


def test_rank_from_file_name_when_the_trace_does_not_say():
    rs = resolve_ranks([("/j/rank1_trace.json", _meta()), ("/j/rank0_trace.json", _meta())])
    assert rs.ranks == (0, 1) and rs.sources == {0: "file name", 1: "file name"}
    assert rs.notes == ()


def test_duplicate_rank_keeps_the_first_by_path_and_names_both():
    rs = resolve_ranks(
        [
            ("/j/run2/r.json", _meta(0, 2)),
            ("/j/run1/r.json", _meta(0, 2)),
            ("/j/x.json", _meta(1, 2)),
        ]
    )
    assert rs.ranks == (0, 1) and rs.paths[0] == "/j/run1/r.json" and rs.left_out == (0,)
    (note,) = rs.notes
    assert "rank 0 has 2 files: /j/run1/r.json (analysed) and /j/run2/r.json (left out)" in note


def test_unreadable_rank_is_said_unreadable():
    rs = resolve_ranks([(f"/j/rank{r}.json", _meta(r, 4)) for r in (0, 1, 3)], ["/j/rank2.json"])
    (note,) = rs.notes
    assert note.startswith("1 rank of the 4 in the job is unreadable (rank 2: its trace could")
    assert "no trace" not in note


def test_missing_ranks_are_named():
    rs = resolve_ranks([(f"/j/{r}.json", _meta(r, 8)) for r in (0, 1, 2, 5, 7)])
    (note,) = rs.notes
    assert "3 ranks of the 8 in the job have no trace (rank 3-4, 6)" in note
    assert "analysed on 5 ranks" in note


def test_gap_without_world_size_is_possibly_missing():
    rs = resolve_ranks([("/j/rank0.json", _meta()), ("/j/rank2.json", _meta())])
    (note,) = rs.notes
    assert "rank 1 is absent between the ranks present (0, 2): possibly missing" in note


def test_world_size_disagreement():
    rs = resolve_ranks(
        [("/j/a.json", _meta(0, 2)), ("/j/b.json", _meta(1, 2)), ("/j/c.json", _meta(2, 4))]
    )
    assert rs.world_size == 2
    assert any(
        "disagree about the world size (2 in /j/a.json, /j/b.json; 4 in /j/c.json)" in n
        for n in rs.notes
    )
    assert any("rank 2 is outside the world size 2" in n for n in rs.notes)


def test_different_steps_are_cut_to_the_common_ones():
    rs = resolve_ranks(
        [
            ("/j/a.json", _meta(0, 3, steps=(3, 4, 5, 6))),
            ("/j/b.json", _meta(1, 3, steps=(4, 5, 6, 7))),
            ("/j/c.json", _meta(2, 3, steps=(4, 5, 6, 7))),
        ]
    )
    assert rs.steps == (4, 5, 6)
    (note,) = rs.notes
    assert "rank 0: steps 3-6; rank 1-2: steps 4-7" in note
    assert "analysed on the 3 steps all ranks cover (4-6)" in note


def test_no_common_step():
    rs = resolve_ranks(
        [("/j/a.json", _meta(0, 2, steps=(1, 2))), ("/j/b.json", _meta(1, 2, steps=(5,)))]
    )
    assert rs.steps == ()
    assert "no step is common to all" in rs.notes[0]


def test_unknown_rank_takes_a_missing_rank_and_says_so():
    rs = resolve_ranks(
        [("/j/a.json", _meta(0, 3)), ("/j/zz.json", _meta(None, 3)), ("/j/c.json", _meta(2, 3))]
    )
    assert rs.ranks == (0, 1, 2) and rs.sources[1] == "file order"
    (note,) = rs.notes
    assert "the rank of 1 file cannot be told" in note and "/j/zz.json as rank 1" in note


def test_one_file_without_rank_is_rank_zero_silently():
    rs = resolve_ranks([("/j/trace.json", _meta())])
    assert rs.ranks == (0,) and rs.notes == ()


def test_synthetic_steps_are_noted():
    rs = resolve_ranks(
        [("/j/a.json", _meta(0, 2)), ("/j/b.json", _meta(1, 2, steps_synthetic=True))]
    )
    assert any("rank 1 has no ProfilerStep ranges" in n for n in rs.notes)


# --- what belongs to one job (check_one_job, run by resolve_ranks) ---


def _rank(r, world=2):
    return _meta(r, world, pg_config=[{"pg_name": "0", "pg_size": world, "ranks": [0, 1]}])


def _single():
    return {"rank": None, "world_size": None, "steps": [1, 2], "device_name": "NVIDIA H200"}


def _refusal(entries, collectives):
    with pytest.raises(TraceError) as e:
        resolve_ranks(entries, collectives=collectives)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_two_jobs_beside_single_traces_are_refused_naming_each():
    """The layout of sample_traces/: two 2-rank job folders and single-GPU traces."""
    entries = [
        ("s/a-balanced/rank0.json.gz", _rank(0)),
        ("s/a-balanced/rank1.json.gz", _rank(1)),
        ("s/b-straggler/rank0.json.gz", _rank(0)),
        ("s/b-straggler/rank1.json.gz", _rank(1)),
        ("s/matmul.json.gz", _single()),
        ("s/decode.json.gz", _single()),
        ("s/add.json.gz", _single()),
    ]
    assert _refusal(entries, [60, 60, 60, 60, 0, 0, 0]) == (
        "s/ holds 2 whole rank sets, separate jobs or profiling windows (a-balanced/, "
        "b-straggler/) and 3 single-GPU traces; diagnose one of these folders, or one trace"
    )


def test_two_jobs_alone_and_rank_folders():
    """Two runs side by side, each rank in its own rank{N}/ folder: the job is the folder above."""
    entries = [
        (f"/d/{run}/rank{r}/trace.json", _meta(r, 2)) for run in ("run1", "run2") for r in (0, 1)
    ]
    assert _refusal(entries, None) == (
        "/d/ holds 2 whole rank sets, separate jobs or profiling windows (run1/, run2/); "
        "diagnose one of these folders, or one trace"
    )


def test_two_profiling_windows_of_one_job_are_not_called_two_jobs():
    """torchtitan's layout: iteration_{n}/rank{r}_trace.json, one folder per profiling window of
    one run; each window is a whole rank set, and nothing in the traces says run or window."""
    entries = [
        (f"out/profile_trace/iteration_{i}/rank{r}_trace.json", _meta(r, 2))
        for i in (10, 20)
        for r in (0, 1)
    ]
    msg = _refusal(entries, None)
    assert msg == (
        "out/profile_trace/ holds 2 whole rank sets, separate jobs or profiling windows "
        "(iteration_10/, iteration_20/); diagnose one of these folders, or one trace"
    )
    # one window's folder is one job
    assert resolve_ranks(entries[:2]).ranks == (0, 1)


def test_refusal_names_url_folders_with_their_scheme():
    entries = [(f"s3://bkt/jobs/{run}/rank{r}.json", _meta(r, 2)) for run in "ab" for r in (0, 1)]
    assert _refusal(entries, None).startswith("s3://bkt/jobs/ holds 2 whole rank sets")
    mixed = [("gs://b/a/rank0.json", _meta(0, 2)), ("gs://b/a/rank1.json", _meta(1, 2))]
    mixed += [("/d/b/rank0.json", _meta(0, 2)), ("/d/b/rank1.json", _meta(1, 2))]
    assert _refusal(mixed, None).startswith("the inputs hold 2 whole rank sets")


def test_a_duplicate_rank_is_taken_from_the_folder_with_its_peers():
    """A crashed run's lone rank0 beside a whole run: rank 0 comes from the whole run (the
    first by path would mix the two runs); with no such difference, the first by path."""
    crashed = [("d/a-crashed/rank0.json", _meta(0, 2))]
    good = [("d/b-good/rank0.json", _meta(0, 2)), ("d/b-good/rank1.json", _meta(1, 2))]
    rs = resolve_ranks(crashed + good, collectives=[3, 3, 3])
    assert rs.paths == {0: "d/b-good/rank0.json", 1: "d/b-good/rank1.json"}
    assert rs.left_out == (0,)
    assert rs.notes[0].startswith(
        "rank 0 has 2 files: d/b-good/rank0.json (analysed) and d/a-crashed/rank0.json (left out)"
    )
    # rank folders of two windows (rank{r}/iteration_{n}/): every rank from the first window
    windows = [
        (f"p/rank{r}/iteration_{i}/trace.json", _meta(r, 2)) for r in (0, 1) for i in (20, 10)
    ]
    assert resolve_ranks(windows).paths == {
        0: "p/rank0/iteration_10/trace.json",
        1: "p/rank1/iteration_10/trace.json",
    }


def test_one_job_beside_a_single_trace_is_refused():
    entries = [
        ("/d/job/rank0.json", _rank(0)),
        ("/d/job/rank1.json", _rank(1)),
        ("/d/cpu.json", {"rank": None, "world_size": None, "steps": [1]}),
    ]
    assert _refusal(entries, [3, 3, 0]) == (
        "/d/ holds 1 job (job/) and 1 single-process trace; diagnose the job's folder, or one trace"
    )
    # without the collective counts, a trace that says nothing is not known to be single
    assert resolve_ranks(entries).ranks == (0, 1, 2)
    # the job's traces in the very folder given: its files, not its folder, are to be given
    side_by_side = [("/d/rank0.json", _rank(0)), ("/d/rank1.json", _rank(1)), entries[2]]
    assert _refusal(side_by_side, [3, 3, 0]) == (
        "/d/ holds 1 job (rank0.json, rank1.json) and 1 single-process trace; diagnose the "
        "job's files, or one trace"
    )


def test_single_traces_only_are_not_one_job():
    entries = [("/d/a.json", _single()), ("/d/b.json", _single())]
    assert _refusal(entries, [0, 0]) == (
        "these 2 traces share no collective and no distributedInfo: they are not one job; "
        "diagnose each alone"
    )
    # one trace is the one-rank case, and ranks without distributedInfo are a job by their
    # collectives
    assert resolve_ranks(entries[:1], collectives=[0]).ranks == (0,)
    rs = resolve_ranks([("/d/rank0.json", _meta()), ("/d/rank1.json", _meta())], collectives=[4, 4])
    assert rs.ranks == (0, 1)


def test_incomplete_folders_stay_one_job_with_a_duplicate_note():
    """run1/ and run2/ each hold rank 0 only: not two whole jobs, so one job whose rank 0 has
    two files (the duplicate note), not a refusal."""
    rs = resolve_ranks(
        [("/j/run2/r.json", _rank(0)), ("/j/run1/r.json", _rank(0)), ("/j/x.json", _rank(1))],
        collectives=[5, 5, 5],
    )
    assert rs.ranks == (0, 1) and rs.left_out == (0,)
    assert "rank 0 has 2 files" in rs.notes[0]
