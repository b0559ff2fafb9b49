"""load_job and `tracedx diagnose` on several traces: generated jobs, unreadable ranks, the
rank-set notes, and the one-file case unchanged."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest
from click.testing import CliRunner
from jobgen import JobSpec, generate

import tracedx
from tracedx.cli import main
from tracedx.errors import TraceError
from tracedx.report import render


@pytest.fixture(scope="module")
def host_job(tmp_path_factory):
    """4 ranks (DP 2 x TP 2), rank 1 a host straggler, tensorboard-style names, 2 hosts."""
    spec = JobSpec(
        world=4,
        tp=2,
        straggler=1,
        straggler_kind="host",
        straggler_pct=300,
        ranks_per_host=2,
        names="tensorboard",
    )
    return generate(spec, tmp_path_factory.mktemp("job"))


def test_summaries_show_the_generated_numbers(host_job):
    job = tracedx.load_job([str(p) for p in host_job.paths.values()][::-1])
    assert [s.meta["rank"] for s in job.summaries] == [0, 1, 2, 3]
    assert {s.meta["rank_source"] for s in job.summaries} == {"distributedInfo"}
    assert [s.meta["hostname"] for s in job.summaries] == ["node0", "node0", "node1", "node1"]
    assert job.notes == []
    truth = host_job.rank_steps
    for s in job.summaries:
        r = s.meta["rank"]
        t = truth.filter(pl.col("rank") == r).sort("step")
        got = s.steps.sort("step")
        assert got["step"].to_list() == [10, 11, 12, 13]
        assert got["compute_us"].to_list() == pytest.approx(t["compute_us"].to_list())
        # collectives never overlap compute here: all communication is exposed
        assert got["comm_us"].to_list() == pytest.approx(t["comm_us"].to_list())
        assert got["exposed_comm_us"].to_list() == pytest.approx(t["comm_us"].to_list())
        # steps are CPU windows here, so a step's idle is the gap before its first kernel, all
        # in 'host work': the host work plus 6 us of launch in the first step, the host work
        # less 42 us after (the previous optimizer kernel runs under it; jobgen's docstring)
        h = t["host_us"].to_list()
        host_idle = got["idle_host_work_us"].to_list()
        assert host_idle == pytest.approx([h[0] + 6.0] + [x - 42.0 for x in h[1:]])
        # and 11 us in 'host sync' between the DP all-reduce and the optimizer kernel (the
        # sync returns 5 us late, the launch takes 6)
        assert got["idle_host_sync_us"].to_list() == pytest.approx([11.0] * 4)
        assert got["idle_us"].to_list() == pytest.approx([x + 11.0 for x in host_idle])
        c = host_job.collectives.filter(pl.col("rank") == r).sort("start_us")
        colls = s.colls.sort("start_us")
        assert colls["comms_id"].to_list() == c["comms_id"].to_list()
        assert colls["seq"].to_list() == c["seq"].to_list()
        assert colls["duration_us"].to_list() == pytest.approx(
            (c["end_us"] - c["start_us"]).to_list()
        )
        assert set(colls["coll_type"]) == {"all_reduce"}


def test_directory_glob_and_file_list_give_one_job(host_job):
    d = host_job.paths[0].parent
    ranks = lambda j: [s.meta["rank"] for s in j.summaries]  # noqa: E731
    assert ranks(tracedx.load_job(d)) == [0, 1, 2, 3]
    assert ranks(tracedx.load_job(str(d / "node1_*.pt.trace.json"))) == [2, 3]


def test_unreadable_rank_is_a_note_and_the_others_are_analysed(host_job, tmp_path):
    for p in host_job.paths.values():
        shutil.copy(p, tmp_path / p.name)
    bad = tmp_path / host_job.paths[2].name
    bad.write_text('{"traceEvents": [')
    job = tracedx.load_job(tmp_path)
    assert [s.meta["rank"] for s in job.summaries] == [0, 1, 3]
    assert len(job.notes) == 2
    assert job.notes[0].startswith(f"left out, cannot be read: {bad}:")
    assert "the other ranks are analysed" in job.notes[0]
    assert "1 rank of the 4 in the job has no trace (rank 2)" in job.notes[1]
    jd = tracedx.diagnose(job)
    assert any("cannot be read" in n for n in jd.notes)


def test_duplicate_and_unequal_windows(tmp_path):
    spec = JobSpec(world=2, windows={1: (11, 13)})
    job = generate(spec, tmp_path / "j")
    (tmp_path / "j" / "again").mkdir()
    shutil.copy(job.paths[0], tmp_path / "j" / "again" / "rank0_trace.json")
    loaded = tracedx.load_job(tmp_path / "j")
    assert [s.meta["rank"] for s in loaded.summaries] == [0, 1]
    dup, steps = loaded.notes
    # the copy in again/ has no peers: the rank 0 beside rank 1 is analysed
    assert f"rank 0 has 2 files: {tmp_path / 'j' / 'rank0_trace.json'} (analysed)" in dup
    assert "again/rank0_trace.json (left out)" in dup
    assert "rank 0: steps 10-13; rank 1: steps 11-13" in steps
    # every rank is cut to the common steps, its tables too
    for s in loaded.summaries:
        assert s.meta["steps"] == [11, 12, 13]
        assert s.steps["step"].to_list() == [11, 12, 13]
        assert set(s.colls["step"]) == {11, 12, 13}


def test_nothing_readable_is_an_error(tmp_path):
    a, b = tmp_path / "rank0.json", tmp_path / "rank1.json"
    a.write_text("nope")
    b.write_text("")
    with pytest.raises(TraceError, match="none of the 2 traces could be read"):
        tracedx.load_job([a, b])
    with pytest.raises(TraceError, match="rank1.json: trace is empty"):
        tracedx.load_job(b)


def test_progress_callback(tmp_path):
    job = generate(JobSpec(world=2), tmp_path)
    seen = []
    tracedx.load_job(job.files, progress=lambda i, n, p: seen.append((i, n, p)))
    # one call per finished rank, counting up; ranks finish in any order on a pool
    assert [(i, n) for i, n, _ in seen] == [(1, 2), (2, 2)]
    assert sorted(p for _, _, p in seen) == sorted(job.files)


def test_cli_one_file_is_the_single_rank_diagnosis_unchanged(host_job):
    p = str(host_job.paths[0])
    for fmt in ("text", "json"):
        r = CliRunner().invoke(main, ["diagnose", p, "--format", fmt])
        assert r.exit_code == 0, r.stderr
        assert r.stdout == render(tracedx.diagnose(tracedx.load(p)), fmt)


def test_cli_several_files_directory_and_glob_print_the_job_report(host_job):
    d = host_job.paths[0].parent
    files = [str(p) for p in host_job.paths.values()]
    for argv in (files, [str(d)], [str(d / "*.pt.trace.json")]):
        r = CliRunner().invoke(main, ["diagnose", *argv, "--format", "json"])
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["schema"] == "tracedx.job/1"
        assert [x["rank"] for x in doc["ranks"]] == [0, 1, 2, 3]
    text = CliRunner().invoke(main, ["diagnose", str(d)])
    assert text.exit_code == 0 and "job of 4 ranks" in text.stdout
    md = CliRunner().invoke(main, ["diagnose", str(d), "--format", "md"])
    assert md.exit_code == 0 and md.stdout.startswith("#")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["/nonexistent/rank0.json", "/nonexistent/rank1.json"], "no such file or directory"),
        (["/nonexistent/*.json"], "no file or directory of traces matches this pattern"),
    ],
)
def test_cli_bad_job_input_is_one_line_exit_2(argv, words):
    r = CliRunner().invoke(main, ["diagnose", *argv])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and words in r.stderr


def test_cli_html_of_a_job_writes_the_job_page(host_job, tmp_path):
    out = tmp_path / "j.html"
    r = CliRunner().invoke(main, ["diagnose", str(host_job.paths[0].parent), "--html", str(out)])
    assert r.exit_code == 0, r.stderr
    page = out.read_text(encoding="utf-8")
    table = page[page.index("id='ranks'") : page.index("</table>", page.index("id='ranks'"))]
    rows = [x.split("'")[0] for x in table.split("<td data-v='")[1::14]]  # 14 columns
    assert "tracedx job report" in page and rows == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    "job, straggler",
    [("ddp_mlp-gloo-balanced", None), ("ddp_mlp-gloo-host-straggler", 1)],
)
def test_committed_gloo_jobs(job, straggler):
    """The CPU gloo DDP pair of sample_traces/multirank.md: no straggler when balanced; rank 1
    (30 ms of host work per step) when not: 10 steps of 2 ranks pass the per-step binomial
    test (2^-10 < 0.01 / 2)."""
    from tests.conftest import SAMPLES

    jd = tracedx.diagnose(tracedx.load_job(SAMPLES / job))
    assert [s.meta["rank"] for s in jd.job.summaries] == [0, 1]
    assert (jd.straggler.rank if jd.straggler else None) == straggler


def test_unrelated_single_rank_traces_are_refused():
    """Two single-GPU sample traces (no collective, no distributedInfo) given together are not
    one job: one line on stderr, exit 2."""
    from tests.conftest import SAMPLES

    a, b = SAMPLES / "add_loop-eager.json.gz", SAMPLES / "attention-naive.json.gz"
    r = CliRunner().invoke(main, ["diagnose", str(a), str(b)])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        "tracedx: error: these 2 traces share no collective and no distributedInfo: they are "
        "not one job; diagnose each alone"
    ]


def test_the_same_answer_for_every_trace_is_said_once(tmp_path):
    # a --steps that no rank has is the option's error, not "could not be read"
    import shutil

    from tests.conftest import SAMPLES

    job = SAMPLES / "ddp_mlp-gloo-balanced"
    if not job.is_dir():
        pytest.skip("sample job missing")
    for f in job.iterdir():
        shutil.copy(f, tmp_path / f.name)
    with pytest.raises(TraceError) as e:
        tracedx.load_job(tmp_path, steps="99..100")
    msg = str(e.value)
    assert msg.startswith("steps 99..100: no such steps; the trace has steps 3..12"), msg
    assert msg.endswith("(each of the 2 traces)") and "could be read" not in msg, msg


def test_cli_a_rank_that_cannot_be_read_is_said_on_stderr_too(tmp_path):
    """One rank of the gloo straggler pair cut short: exit 0, the job of the other rank, the
    lost rank in NOTES and in one note on stderr (none under -q); the collectives' header
    counts them without calling the unmatched ones matched."""
    from tests.conftest import SAMPLES

    src = SAMPLES / "ddp_mlp-gloo-host-straggler"
    shutil.copy(src / "rank0.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "rank1.json.gz").write_bytes((src / "rank1.json.gz").read_bytes()[:20000])
    r = CliRunner().invoke(main, ["diagnose", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert r.stderr == (
        "tracedx: 1 of 2 rank traces could not be read (rank1.json.gz: truncated gzip); "
        "diagnosed from 1 rank\n"
    )
    lines = r.stdout.splitlines()
    assert lines[0].startswith("tracedx · job of 1 rank · ")
    assert "COLLECTIVES (60 collectives: unmatched 60; clock: one host)" in lines
    notes = " ".join(r.stdout.split("\nNOTES\n")[1].split())  # a long path wraps the note
    assert f"- left out, cannot be read: {tmp_path / 'rank1.json.gz'}: truncated gzip" in notes
    q = CliRunner().invoke(main, ["diagnose", str(tmp_path), "-q", "--workers", "1"])
    assert q.exit_code == 0 and q.stderr == "" and q.stdout == r.stdout
    # the files named with ./ and // (the reader's message spells the path normalised): the
    # same reason, not the path given as the reason
    odd = [f"{tmp_path}/./rank0.json.gz", f"{tmp_path}//rank1.json.gz"]
    o = CliRunner().invoke(main, ["diagnose", *odd])
    assert o.exit_code == 0 and o.stderr == r.stderr
    notes = " ".join(o.stdout.split("\nNOTES\n")[1].split())
    assert f"- left out, cannot be read: {odd[1]}: truncated gzip: " in notes


def test_unreadable_note_names_the_first_file_and_counts_the_rest():
    from tracedx.cli import _unreadable_note

    bad = [("/x/rank1.json.gz", "not a trace: not JSON (it starts with 'a')"), ("/x/r2", "?")]
    assert _unreadable_note(bad, 4, 2) == (
        "2 of 4 rank traces could not be read (rank1.json.gz: not a trace and 1 more); "
        "diagnosed from 2 ranks"
    )
