"""The suite's settings (threads, offline, hypothesis profiles) and its plugins: the shared fixtures
(``support.fixtures``: models, the demo corpus, Ray, an empty working directory per test) and the
packaged corpora (``support.corpora``).  Helpers are imported from ``support``, never from a test
module or this file."""

import os
import re

from mimi_extract.common.threads import passive_openmp

# torch's OpenMP threads wait passively, as in the tool's own processes (before torch loads libgomp;
# the CLI subprocesses inherit it): spinning threads on a busy machine burn the cores the rest of the
# suite needs
passive_openmp()

import hypothesis  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

pytest_plugins = ("support.fixtures", "support.corpora")

# 2 threads, or a fair share of the cores when pytest-xdist runs the suite in several processes (-n)
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Ray's workers (the engine's actors) at the tests' own niceness, not Ray's default 15: on a busy
# machine (CI beside other jobs) nice-15 actors get almost no CPU, and the Ray tests, one after
# another in one process, became the whole suite's tail (measured: a fresh clone's slow tier beside
# two spinning processes); the cluster's own and a CLI subprocess's private one read it at start
os.environ.setdefault("RAY_worker_niceness", "0")

# property-based fuzzing (the parsers the tool owns): a small budget per test in the suite; a longer
# run with HYPOTHESIS_PROFILE=long (docs/inputs.md says how long it ran and what it found)
hypothesis.settings.register_profile("suite", max_examples=30, deadline=None)
hypothesis.settings.register_profile("long", max_examples=3000, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, as scripts/test.sh runs the suite), the tests that
    use Ray run one after another in one process: they share the session's cluster, and some find a
    Ray actor's process by its name (``pgrep``), which must not be another process's actor."""
    for item in items:
        if "ray_cluster" in item.fixturenames or re.search(r"(^|[^a-z])ray([^a-z]|$)", item.name):
            item.add_marker(pytest.mark.xdist_group("ray"))
    if getattr(config.option, "loadgroup", False):  # (set in pytest-xdist's worker processes under --dist loadgroup)
        _name_groups(items)


def _name_groups(items):
    """pytest-xdist sends the tests whose node ids end in ``@group`` to one process; its own hook
    writes that suffix to ``item._nodeid``, which pytest 9 no longer reads (a node's id is ``_id``):
    without this, every ``xdist_group`` was spread over all the processes (each started its own Ray
    cluster, and built each module's fixtures once per process)."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # (pytest 8: xdist's own suffix is read, nothing to do)
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if "ray" in names:  # a Ray test in a grouped module stays with the other Ray tests (one cluster)
            names = ["ray"]
        if names and not item.nodeid.endswith("@" + "_".join(names)):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")
