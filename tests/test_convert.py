"""tables.Converter: the shortcuts of column building give the values the general path gives."""

from __future__ import annotations

import pickle

import msgspec
import polars as pl

from tracedx.trace.events import Event
from tracedx.trace.tables import TableBuilder, _str_col, build_tables


def _events(*evs: dict) -> list[Event]:
    return msgspec.json.decode(msgspec.json.encode(list(evs)), type=list[Event], strict=False)


def _op(ts: float, name: str = "aten::mm", **args) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 2, "ts": ts, "dur": 1.0,
            "args": args}  # fmt: skip


def test_ops_without_shapes_share_one_key_with_the_general_path():
    # chunk 1: no op has shapes (the all-absent shortcut); chunk 2: mixed (the general path);
    # the absent key of both is one code after the merge
    b = TableBuilder()
    b.add(_events(_op(1.0), _op(2.0)))
    b.add(
        _events(
            _op(3.0),  # first, as the shortcut looks at the first op before counting
            _op(4.0, **{"Input Dims": [[2, 3], []], "Input type": ["float", "Scalar"]}),
            _op(5.0, **{"Concrete Inputs": ["", "1"]}),
        )
    )
    ops = b.finish().ops
    assert ops["input_shapes"].to_list() == [None, None, None, [[2, 3], []], None]
    assert ops["input_dtypes"].to_list() == [None, None, None, ["float", "Scalar"], None]
    assert ops["concrete_inputs"].to_list() == [None, None, None, None, ["", "1"]]


def test_an_op_without_args_reads_as_one_without_shapes():
    ops = build_tables(_events({**_op(1.0), "args": None}, _op(2.0))).ops
    assert ops["input_shapes"].to_list() == [None, None]
    assert ops["external_id"].to_list() == [None, None]


def test_the_lower_case_external_id_only_where_the_other_is_missing():
    both = {"External id": 9, "external id": 10}
    ops = build_tables(
        _events(_op(1.0, **{"External id": 5}), _op(2.0, **{"external id": 7}), _op(3.0, **both))
    ).ops
    assert ops["external_id"].to_list() == [5, 7, 9]
    # every op has the usual spelling: the other is never read
    ops = build_tables(_events(_op(1.0, **{"External id": 5}), _op(2.0, **both))).ops
    assert ops["external_id"].to_list() == [5, 9]


def test_collective_annotations_are_found_by_name():
    ann = {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 2, "dur": 5.0,
           "args": {"Input Dims": [[4], [3]], "Input type": ["float"]}}  # fmt: skip
    raw = build_tables(
        _events(
            {**ann, "name": "nccl:all_reduce", "ts": 1.0},
            {**ann, "name": "ProfilerStep#1", "ts": 2.0},
            {**ann, "name": "my nccl:all_reduce", "ts": 3.0},
            {**ann, "name": "gloo:send 0->1", "ts": 4.0},
        )
    )
    comm = raw.comm_args
    assert comm["collective_name"].to_list() == ["all_reduce", "send"]
    assert comm["in_nelems"].to_list() == [7, 4]  # a coalesced all-reduce counts every input
    assert raw.annotations.height == 4


def test_a_repeated_name_is_stored_once():
    # polars strings are views into buffers: a column built from the distinct names shares
    # them (its pickle, as the worker process sends a chunk, holds each name once)
    names = [f"void a_kernel_name_longer_than_a_view<{i % 3}>(float*)" for i in range(1000)]
    names[7] = None
    col = _str_col(names)
    assert col.to_list() == [n or "" for n in names]
    plain = pl.Series(names, dtype=pl.Utf8).fill_null("")
    assert len(pickle.dumps(col)) < len(pickle.dumps(plain)) / 2
    assert _str_col(names[:10]).to_list() == plain[:10].to_list()  # a few: stored as they are


def test_op_shapes_and_types_read_by_polars_match_the_python_rules():
    # the first table's values are all plain (read from the raw JSON by polars); each odd value
    # of the second makes its column take the Python rules (_shapes, _strs), which must agree
    plain = [
        _op(1.0, **{"Input Dims": [[2, 3], [], [-(2**63)]], "Input type": ["float", ""],
                    "Concrete Inputs": ["", "[1, 2]"]}),
        _op(2.0, **{"Input Dims": [[2**63 - 1]], "Input type": ["c10::BFloat16"]}),
        _op(3.0),
    ]  # fmt: skip
    ops = build_tables(_events(*plain)).ops
    assert ops["input_shapes"].to_list() == [[[2, 3], [], [-(2**63)]], [[2**63 - 1]], None]
    assert ops["input_dtypes"].to_list() == [["float", ""], ["c10::BFloat16"], None]
    assert ops["concrete_inputs"].to_list() == [["", "[1, 2]"], None, None]
    odd = [
        _op(4.0, **{"Input Dims": [[2**63], [True], [1.5], 7, [[1]]], "Input type": [None, 3],
                    "Concrete Inputs": ['say "caf\u00e9"']}),
        _op(5.0, **{"Input Dims": {"a": 1}, "Input type": "float", "Concrete Inputs": [False]}),
    ]  # fmt: skip
    ops = build_tables(_events(*plain, *odd)).ops
    assert ops["input_shapes"].to_list()[3:] == [[[0], [], [], [], []], None]
    assert ops["input_dtypes"].to_list()[3:] == [["", "3"], None]
    assert ops["concrete_inputs"].to_list()[3:] == [['say "caf\u00e9"'], ["False"]]


def _raw_ops(*args_json: str) -> list[Event]:
    """cpu ops whose args are the raw JSON texts given (their spelling kept, not re-encoded)."""
    evs = ",".join(
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, '
        f'"ts": {i + 1}, "dur": 1, "args": {a}}}'
        for i, a in enumerate(args_json)
    )
    return msgspec.json.decode(f"[{evs}]", type=list[Event], strict=False)


def _codes_match_lists(ops: pl.DataFrame) -> None:
    """``shape_code`` is equal for two ops exactly when their three list columns are."""
    lists = ["input_shapes", "input_dtypes", "concrete_inputs"]
    n = ops.select(lists).n_unique()
    assert ops["shape_code"].n_unique() == n == ops.select(*lists, "shape_code").n_unique()


def test_the_shape_code_is_one_per_decoded_value_whatever_the_spelling():
    """Raw spellings that read as the same lists (spaces, a TensorList read as ``[]``, a
    number among the concrete inputs read as its text) share one code, in one chunk and across
    chunks; other values (concrete inputs, none at all) get their own."""
    same = (
        '{"Input Dims": [[2, 3], []], "Input type": ["float", "Scalar"], "Concrete Inputs": ["", "1"]}',
        '{"Input Dims":[[2,3],[]],"Input type":["float","Scalar"],"Concrete Inputs":["","1"]}',
        '{"Input Dims": [[2, 3], [[4]]], "Input type": ["float", "Scalar"], "Concrete Inputs": ["", 1]}',
    )  # fmt: skip
    other = '{"Input Dims": [[2, 3], []], "Input type": ["float", "Scalar"], "Concrete Inputs": ["", "2"]}'  # fmt: skip
    b = TableBuilder()
    b.add(_raw_ops(same[0], "{}", other))
    b.add(_raw_ops(same[1], same[2], "{}"))
    ops = b.finish().ops
    assert ops.schema["shape_code"] == pl.UInt32
    assert ops["input_shapes"].to_list() == [[[2, 3], []], None, [[2, 3], []]] + [[[2, 3], []]] * 2 + [None]  # fmt: skip
    code = ops["shape_code"].to_list()
    assert code[0] == code[3] == code[4] and code[1] == code[5]
    assert len({code[0], code[1], code[2]}) == 3
    _codes_match_lists(ops)
    # numbered by first appearance: the chunking does not change the codes
    one = build_tables(_raw_ops(same[0], "{}", other, same[1], same[2], "{}")).ops
    assert one["shape_code"].to_list() == code == [0, 1, 2, 0, 0, 1]
    assert build_tables([]).ops.schema["shape_code"] == pl.UInt32


def test_plain_values_are_grouped_as_the_polars_group_by_groups_them(monkeypatch):
    """When every value reads plain (lists of ints and of strings, no escape), the shape code
    is numbered in Python from the decoded values (``TableBuilder._op_shapes``): spellings of
    one value share a code, numbered by first appearance, as the group_by path numbers them."""
    a = '{"Input Dims": [[2, 3], []], "Input type": ["float", ""], "Concrete Inputs": ["", "1"]}'
    a2 = '{"Input Dims":[[2,3],[]],"Input type":["float",""],"Concrete Inputs":["","1"]}'
    b = '{"Input Dims": [[2, 3], []], "Input type": ["float", ""], "Concrete Inputs": ["", "2"]}'
    c = '{"Input Dims": [[2, 3], []], "Input type": ["float", ""]}'
    evs = [b, a, "{}", a2, c, a, "{}"]
    ops = build_tables(_raw_ops(*evs)).ops
    assert ops["shape_code"].to_list() == [0, 1, 2, 1, 3, 1, 2]
    _codes_match_lists(ops)
    # the same numbers by the general path (no value read plain)
    from tracedx.trace import tables

    monkeypatch.setattr(tables, "_plain_column", lambda raws, col: None)
    assert build_tables(_raw_ops(*evs)).ops.equals(ops)


def test_a_whole_document_and_chunks_give_the_same_tables():
    """A whole small document's columns (names as they are, ``end_us`` from the converter) and
    chunks' (names stored once, ``end_us`` at the end) make equal tables, even mixed."""
    a = '{"Input Dims": [[2, 3]], "Input type": ["float"], "Concrete Inputs": [""]}'
    evs = _raw_ops(a, "{}", a)
    whole = TableBuilder()
    whole.add(evs, whole=True)
    chunked = TableBuilder()
    chunked.add(evs)
    mixed = TableBuilder()
    mixed.add(evs, whole=True)
    mixed.add(evs)
    t1, t2, t3 = whole.finish(), chunked.finish(), mixed.finish()
    for name in ("ops", "kernels", "launches", "annotations", "memory", "comm_args"):
        x, y = getattr(t1, name), getattr(t2, name)
        assert x.equals(y) and x.columns == y.columns, name
        assert getattr(t3, name).columns == x.columns, name
    assert t3.ops.equals(pl.concat([t1.ops, t1.ops]))
