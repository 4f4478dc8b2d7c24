"""Feeding processes per GPU by default (issue 34): one process's GIL caps what it feeds a GPU, so
each GPU gets enough processes for its target and no more than the cores allow; each process writes
its own shards (issue 40), so no single writer caps the machine.  The rule is tested here; its
figures are measured by scripts/bench_ceilings.py procs (null encoder, CPU time)."""

import pytest
import torch

from mimi_extract.config import rates
from mimi_extract.engines.device import resolve_devices
from mimi_extract.config.settings import feeders_per_gpu


def test_feeders_per_gpu_from_cores_and_gpus(monkeypatch):
    monkeypatch.setattr(rates, "TARGET_X", 20_000)
    monkeypatch.setattr(rates, "PROCESS_X", 7_000)
    monkeypatch.setattr(rates, "WRITER_X", {"hdf5": 12_000})  # (a Ray driver's, for actors that do not see OUT): not the local engine's cap
    assert feeders_per_gpu(1, cores=16) == 3  # 20,000x / 7,000x per process
    assert feeders_per_gpu(1, cores=4) == 2  # half the cores at most: 2 each
    assert feeders_per_gpu(1, cores=2) == 1
    assert feeders_per_gpu(8, cores=112) == 3  # every GPU at 20,000x: 8 x 3 processes, each its own writer
    assert feeders_per_gpu(8, cores=32) == 2


@pytest.fixture
def two_gpus(monkeypatch):
    """resolve_devices' view of a machine with 2 GPUs (nothing runs on them here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("mimi_extract.engines.device.feeders_per_gpu", lambda gpus: {1: 2, 2: 3}[gpus])


def test_each_gpu_named_once_gets_the_default_feeders(two_gpus):
    assert resolve_devices("auto") == ("cuda:0",) * 3 + ("cuda:1",) * 3
    assert resolve_devices("cuda:1") == ("cuda:1", "cuda:1")
    assert resolve_devices("cuda:1", feeders=2) == ("cuda:1", "cuda:1")
    assert resolve_devices("cuda:0,cuda:0") == ("cuda:0", "cuda:0")  # said by hand: as given
    with pytest.raises(ValueError, match="give one of them"):
        resolve_devices("cuda:0,cuda:0", feeders=2)
    assert resolve_devices("cpu", cpu_workers=2, feeders=4) == ("cpu", "cpu")  # CPU workers are encoders
