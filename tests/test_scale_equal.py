"""The same job JSON everywhere: the local spawn pool, a Dask LocalCluster, and a real
``dask scheduler`` + ``dask worker`` processes on localhost, on the 2-rank real traces (HTA's
``trace_filter`` sample, skipped without ../shared) and on a 64-rank generated job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import tracedx
from tests.conftest import PUBLIC

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Three places to run the map: the local pool (None), a LocalCluster's client, and the
    address of a real scheduler with two worker processes."""
    from tests.daskprocs import dask_cluster
    from tracedx.job.executor import local_cluster

    with (
        local_cluster(2) as cluster,
        distributed.Client(cluster) as client,
        dask_cluster(tmp_path_factory.mktemp("dask")) as address,
    ):
        yield {"local pool": None, "LocalCluster": client, "dask processes": address}


def _everywhere(paths, engines) -> dict[str, str]:
    out = {}
    for name, client in engines.items():
        job = tracedx.load_job(paths, client=client, progress=False)
        out[name] = tracedx.diagnose(job).to_json()
    return out


def test_64_rank_job_is_byte_identical_on_the_pool_localcluster_and_dask_processes(
    engines, tmp_path
):
    sys.path.insert(0, str(Path(__file__).parent))  # jobgen imports tracebuilder by name
    from tests.jobgen import JobSpec, generate

    spec = JobSpec(world=64, steps=20, straggler=37, straggler_kind="host", straggler_pct=400)
    generate(spec, tmp_path)
    paths = sorted(str(p) for p in tmp_path.iterdir())
    got = _everywhere(paths, engines)
    assert got["local pool"] == got["LocalCluster"] == got["dask processes"]
    doc = json.loads(got["local pool"])
    assert len(doc["ranks"]) == 64 and doc["straggler"]["rank"] == 37  # a real answer


def test_2_rank_real_traces_are_byte_identical_everywhere(engines):
    paths = [PUBLIC / "hta" / f"trace_filter__sampled_rank-{r}.json.gz" for r in (0, 1)]
    if not all(p.exists() for p in paths):
        pytest.skip("../shared/public_traces is not present")
    got = _everywhere([str(p) for p in paths], engines)
    assert got["local pool"] == got["LocalCluster"] == got["dask processes"]
    assert [r["rank"] for r in json.loads(got["local pool"])["ranks"]] == [0, 1]
