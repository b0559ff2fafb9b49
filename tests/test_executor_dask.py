"""The per-rank map on Dask: a LocalCluster (processes) through Client.get_executor()."""

from __future__ import annotations

import pytest

from tests import rankmap
from tracedx.job import executor as ex

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    with ex.local_cluster(2) as cluster, distributed.Client(cluster) as c:
        yield c


_ranks = rankmap.write_ranks


def test_dask_map_matches_the_local_pool(client, tmp_path):
    paths = _ranks(tmp_path, ["a", "bad", "c", "d"])
    on_dask = ex.map_ranks(paths, client=client, **rankmap.STANDIN, progress=False)
    local = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, progress=False)
    assert on_dask == local
    assert on_dask[1].note == f"{paths[1]}: not a trace"


def test_dask_worker_killed_once_is_retried_twice_is_a_note(tmp_path):
    # More ranks than twice the cluster's threads, as in any real job: Dask then queues them on
    # the scheduler and sends each worker one at a time (worker-saturation 1.0), so no rank
    # waits on a worker behind the one that kills it (with fewer, Dask assigns them all at
    # once and counts a queued rank's dying worker against it too). The dying ranks run a
    # second first, so that no worker dies while its nanny is still starting it. A cluster of
    # its own that allows one death per task (Dask's default allows three): after several
    # deaths in a row Dask may close the nannies it restarted, leaving no workers (seen under
    # load), so the fewer deaths the better.
    import dask

    paths = _ranks(tmp_path, ["a", "die-once 1", "die 1", "d", "e", "f"])
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        ex.local_cluster(2) as cluster,
        distributed.Client(cluster) as client,
    ):
        out = ex.map_ranks(paths, client=client, **rankmap.STANDIN, progress=False)
    assert [r.summary for r in out] == [
        b"summary of a",
        b"summary of die-once 1",
        None,
        b"summary of d",
        b"summary of e",
        b"summary of f",
    ]
    assert out[2].note.startswith(f"{paths[2]}: the worker running it died every time")


def test_polars_threads_are_capped_on_the_local_cluster(client, tmp_path):
    paths = _ranks(tmp_path, ["a"])
    (out,) = ex.map_ranks(
        paths, client=client, fn=rankmap.polars_threads_task, decode=bytes, progress=False
    )
    n = max(1, ex.cpu_count() // 2)
    assert out.summary == f"{n} {n}".encode()


def test_a_missing_dask_is_one_clear_error(monkeypatch, tmp_path):
    import builtins

    from tracedx.errors import TraceError

    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name == "distributed":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(TraceError, match=r"pip install 'tracedx\[dask\]'"):
        ex.map_ranks(_ranks(tmp_path, ["a"]), client="tcp://127.0.0.1:1", **rankmap.STANDIN)


def test_a_real_dask_scheduler_and_workers_give_the_same_results(tmp_path):
    from tests.daskprocs import dask_cluster

    paths = _ranks(tmp_path, ["a", "bad", "c", "die-once"])
    with dask_cluster(tmp_path) as address:
        remote = ex.map_ranks(paths, client=address, **rankmap.STANDIN, progress=False)
    local = ex.map_ranks(paths, **rankmap.STANDIN, workers=2, progress=False)
    assert remote == local
    assert [r.summary for r in local] == [
        b"summary of a",
        None,
        b"summary of c",
        b"summary of die-once",
    ]
