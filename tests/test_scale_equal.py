"""The same job JSON everywhere: the local spawn pool, a Dask LocalCluster, and a real
``dask scheduler`` + ``dask worker`` processes on localhost, on the 2-rank real traces (HTA's
``trace_filter`` sample, skipped without ../shared) and on a 64-rank generated job."""

from __future__ import annotations

import json

import pytest

import tracedx
from tests.conftest import PUBLIC

distributed = pytest.importorskip("distributed")


def _job_json(paths, **kw) -> str:
    job = tracedx.load_job(paths, progress=False, **kw)
    return tracedx.diagnose(job).to_json()


def _everywhere(paths, tmp_path) -> list[str]:
    from tests.daskprocs import dask_cluster
    from tracedx.job.executor import local_cluster

    out = [_job_json(paths)]
    with local_cluster(2) as cluster, distributed.Client(cluster) as client:
        out.append(_job_json(paths, client=client))
    with dask_cluster(tmp_path) as address:
        out.append(_job_json(paths, client=address))
    return out


@pytest.fixture(scope="module")
def job64(tmp_path_factory):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))  # jobgen imports tracebuilder by name
    from tests.jobgen import JobSpec, generate

    folder = tmp_path_factory.mktemp("job64")
    spec = JobSpec(world=64, tp=1, steps=3, straggler=37, straggler_kind="host",
                   straggler_pct=400)
    truth = generate(spec, folder)
    return sorted(str(p) for p in folder.iterdir()), truth


def test_64_rank_job_is_byte_identical_on_the_pool_localcluster_and_dask_processes(
    job64, tmp_path
):
    paths, _ = job64
    local, on_local_cluster, on_processes = _everywhere(paths, tmp_path)
    assert local == on_local_cluster == on_processes
    doc = json.loads(local)
    assert len(doc["ranks"]) == 64  # a real answer, not an empty one


def test_2_rank_real_traces_are_byte_identical_everywhere(tmp_path):
    paths = [PUBLIC / "hta" / f"trace_filter__sampled_rank-{r}.json.gz" for r in (0, 1)]
    if not all(p.exists() for p in paths):
        pytest.skip("../shared/public_traces is not present")
    local, on_local_cluster, on_processes = _everywhere([str(p) for p in paths], tmp_path)
    assert local == on_local_cluster == on_processes
