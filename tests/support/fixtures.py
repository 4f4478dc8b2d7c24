"""The shared fixtures, a pytest plugin (tests/conftest.py registers it): the seeded random models,
the demo corpus, the session's Ray cluster, and an empty working directory for every test."""

import pytest

from mimi_extract.codec.demo import random_model, write_corpus


@pytest.fixture(autouse=True)
def _empty_working_directory(tmp_path_factory, monkeypatch):
    """Every test runs in an empty working directory of its own: none may depend on what the folder
    pytest was started from holds (the README's offline step leaves ``tiny/``, ``demo/`` and ``out/``
    in the repository root, and a relative model name such as ``tiny`` would resolve there)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(scope="session")
def tiny_model():
    return random_model(seed=0)


@pytest.fixture(scope="session")
def full_model():
    """kyutai/mimi's architecture (MimiConfig() defaults) with seeded random weights, built once: the
    tests that take it only read it (it stays on the CPU)."""
    from transformers import MimiConfig

    return random_model(MimiConfig(), seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_model):
    path = tmp_path_factory.mktemp("model") / "tiny-mimi"
    tiny_model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for every in-process Ray test (``extract`` / ``cli`` with ``--engine ray``,
    Ray Data): the engine uses an initialised Ray and leaves it running, so the seconds of a cluster
    start are paid once per session, not once per test.  4 logical CPUs: Ray Data's two 1-CPU actors
    must leave room for its read and write tasks (else they wait forever).  The engine's own private
    cluster (started, reaped, shut down by the run, every core of the machine) stays tested through a
    CLI subprocess: ``test_ray_driver_killed_takes_its_private_cluster``; every other Ray test shares
    this one (a cluster start costs seconds of CPU in Ray's own daemons, outside pytest's rusage)."""
    import logging

    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    described = write_corpus(str(root))
    return str(root), described
