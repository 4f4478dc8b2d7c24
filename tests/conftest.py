import os
import signal
import subprocess
import sys

import hypothesis
import numpy as np
import pytest
import soundfile as sf
import torch

from mimi_extract.codec.demo import random_model, write_corpus

torch.set_num_threads(2)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# property-based fuzzing (the parsers the tool owns): a small budget per test in the suite; a longer
# run with HYPOTHESIS_PROFILE=long (docs/inputs.md says how long it ran and what it found)
hypothesis.settings.register_profile("suite", max_examples=30, deadline=None)
hypothesis.settings.register_profile("long", max_examples=3000, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))
ONE_WORKER = ["--device", "cpu", "--cpu-workers", "1", "--num-workers", "1"]  # a CLI run in one process
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tolerance(reference: torch.Tensor) -> float:
    """1e-5, scaled by the output magnitude when it exceeds 1: fp32 rounding is relative, and
    oneDNN picks different conv kernels for different lengths (measured: ~1e-6 relative)."""
    return 1e-5 * max(1.0, float(reference.abs().max()))


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
    cluster (started, reaped, shut down by the run) stays tested through CLI subprocesses:
    ``test_ray_driver_killed_takes_its_private_cluster`` and ``test_hangs``' ray engine."""
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


def write_noise(path, samples: int, rate: int = 24_000, rng=None, level: float = 0.2, channels: int = 1,
                subtype: str | None = None) -> None:
    """A white-noise file of ``samples`` frames (PCM-16 unless ``subtype``, e.g. "FLOAT")."""
    rng = np.random.default_rng(0) if rng is None else rng
    data = (level * rng.standard_normal(samples if channels == 1 else (samples, channels))).astype(np.float32)
    sf.write(str(path), data, rate, **({"subtype": subtype} if subtype else {}))


def ragged(lengths, seed=0, garbage=None):
    """Items and their right-padded batch; the padding holds ``garbage`` to prove it is ignored."""
    g = torch.Generator().manual_seed(seed)
    items = [0.3 * torch.randn(n, generator=g) for n in lengths]
    batch = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
    if garbage is not None:
        for row, n in enumerate(lengths):
            batch[row, n:] = garbage
    return items, batch


def cli(*args, env=None):
    """The CLI in-process; ``text`` is the output with rich's line wrapping (long paths) undone."""
    from typer.testing import CliRunner

    from mimi_extract.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    result.text = " ".join(result.output.split())
    return result


def cli_process(*args, **kwargs) -> subprocess.Popen:
    """The real CLI in a subprocess (python -m mimi_extract), for kill/signal tests."""
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", **kwargs.pop("env", {})}
    # as from a terminal: SIGINT is not ignored (a test session started in the background, `pytest &`,
    # inherits SIG_IGN for it, and Python then keeps ignoring it until the run installs its handlers)
    kwargs.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return subprocess.Popen([sys.executable, "-m", "mimi_extract", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
