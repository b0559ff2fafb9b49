"""tracedx.trace.head: the keys before traceEvents, from the first KiB of a file."""

import gzip
import json

from tracedx.trace.head import head_metadata

DIST = {"backend": "nccl", "rank": 3, "world_size": 8, "pg_config": [{"pg_size": 8}]}


def _write(path, text: str, gz: bool = False):
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_keys_before_the_events_plain_and_gzipped(tmp_path):
    doc = {"schemaVersion": 1, "distributedInfo": DIST, "traceEvents": [], "traceName": "x"}
    text = json.dumps(doc, indent=1)  # Kineto's spacing and newlines between keys
    for gz in (False, True):
        head = head_metadata(_write(tmp_path / f"t{gz}.json", text, gz))
        assert head == {"schemaVersion": 1, "distributedInfo": DIST}  # traceName is after


def test_events_first_gives_no_keys_and_a_tail_key_is_not_seen(tmp_path):
    p = _write(tmp_path / "t.json", json.dumps({"traceEvents": [], "distributedInfo": DIST}))
    assert head_metadata(p) == {}


def test_what_cannot_be_told_is_none(tmp_path):
    big = json.dumps({"deviceProperties": ["x" * 100_000], "traceEvents": []})
    cases = {
        "beyond.json": big,  # the key past the first 64 KiB
        "array.json": "[" + json.dumps({"ph": "X"}) + "]",  # a bare array: no key
        "broken.json": '{"schemaVersion": 1, "a": [1, "traceEvents": []}',
        "text.json": "not json traceEvents",
        "empty.json": "",
    }
    for name, text in cases.items():
        assert head_metadata(_write(tmp_path / name, text)) is None, name
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 40)  # a broken gzip stream
    assert head_metadata(tmp_path / "bad.json.gz") is None
    assert head_metadata(tmp_path / "missing.json") is None
    assert head_metadata(tmp_path) is None  # a directory


def test_a_fifo_is_not_opened(tmp_path):
    import os

    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    assert head_metadata(fifo) is None  # opening it would block until a writer came


def test_a_crafted_process_group_list_is_no_group():
    """pg_config of 5 (not a list) in a head: no group, not a TypeError out of the refusal."""
    from tracedx.job.discover import check_heads

    metas = [(f"a/rank{r}.json", {"rank": r, "world_size": 1, "pg_config": 5}) for r in (0, 1)]
    check_heads(metas, [p for p, _ in metas] * 2)  # nothing surely a rank: nothing refused
