"""Reading an OUT for training: ``OutDataset`` + ``pad_collate`` and the lhotse ``CutsDataset``
in DataLoader workers started with ``spawn`` and with ``fork``, over every output format (Megatron's
tokens decoded back to codes); each
batch holds exactly ``mimi_extract.read``'s arrays, padded, with lengths, masks and text."""

import pickle

import pytest
import torch

lhotse = pytest.importorskip("lhotse")

import mimi_extract  # noqa: E402
from mimi_extract import read  # noqa: E402
from mimi_extract.readers.dataset import CutsDataset, OutDataset, PadCollate, pad_collate  # noqa: E402
from support import OnDemand, extract  # noqa: E402
from support.registered import format_cases  # noqa: E402
from mimi_extract.config.settings import Settings  # noqa: E402

WORKERS = {"spawn": 1, "fork": 2}  # a spawned worker imports torch and lhotse anew (seconds each on 2 cores)
# the module's tests in one pytest-xdist process: each format's OUT is then made once, not once in each
# process that runs one of them (scripts/test.sh: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("training")


@pytest.fixture(scope="module")
def outs(corpus, tiny_model_dir, tmp_path_factory):
    """The corpus as codes in each registered format, each made once a test asks for it."""
    root, _ = corpus

    def make(fmt):
        out = str(tmp_path_factory.mktemp(fmt) / "out")
        assert extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0, format=fmt),
                       shard_size=3).ok == 7
        return out

    return OnDemand(make)


def check_batch(batch, arrays: dict, key_field: str, pad_value=0):
    data, lengths, mask = batch["data"], batch["lengths"], batch["mask"]
    assert data.dtype == torch.int16 and lengths.dtype == torch.int64 and mask.dtype == torch.bool
    assert data.shape[:2] == mask.shape and data.shape[1] == int(lengths.max())
    for i, key in enumerate(batch[key_field]):
        want = arrays[key]
        assert int(lengths[i]) == want.shape[0]
        assert torch.equal(data[i, : want.shape[0]], torch.from_numpy(want)), key
        assert (data[i, want.shape[0]:] == pad_value).all()
        assert mask[i].tolist() == [t < want.shape[0] for t in range(data.shape[1])]
    return list(batch[key_field])


def batches_of(out):
    """OUT's dataset, its arrays by key, and its batches of 3 (index lists into the dataset)."""
    dataset = mimi_extract.open(out).dataset()
    pickle.loads(pickle.dumps(dataset))  # 'Can't pickle local object Reader.dataset.<locals>.OutDataset' before
    arrays = {k: read(out, k) for k in dataset.keys}
    assert len({a.shape[0] for a in arrays.values()}) > 1  # items of different lengths
    return dataset, arrays, [list(range(i, min(i + 3, len(dataset)))) for i in range(0, len(dataset), 3)]


@pytest.mark.parametrize("fmt", format_cases("training_batches"))
def test_out_dataset_and_pad_collate_in_workers(outs, fmt):
    """In forked DataLoader workers (spawned ones: test_spawned_workers_read_every_format)."""
    out = outs[fmt]
    dataset, arrays, _ = batches_of(out)
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=WORKERS["fork"], collate_fn=pad_collate,
                                         multiprocessing_context="fork")
    seen = [k for batch in loader for k in check_batch(batch, arrays, "key")]
    assert sorted(seen) == sorted(arrays)
    # a pad value no codebook uses; the same through OutDataset(path)
    batch = PadCollate(pad_value=-1)([OutDataset(out)[i] for i in range(len(dataset))])
    check_batch(batch, arrays, "key", pad_value=-1)


def recipe_cuts(out):
    """The README's recipe over OUT: ``read_cuts`` (with supervisions), a lhotse sampler; its
    batches (CutSets) and the arrays by cut id."""
    from lhotse import SupervisionSegment
    from lhotse.dataset import DynamicBucketingSampler

    cuts = mimi_extract.read_cuts(out).to_eager()
    for c in cuts:
        c.supervisions = [SupervisionSegment(f"{c.id}-{j}", c.recording_id, start=j * c.duration / 2,
                                             duration=c.duration / 2, text=f"{c.id} half {j}") for j in (1, 0)]
    sampler = DynamicBucketingSampler(cuts, max_duration=6.0, num_buckets=2, shuffle=True, seed=0)
    return sampler, {c.id: read(out, c.id) for c in cuts}


def check_cuts_batch(batch, arrays):
    assert batch["text"] == [f"{i} half 0 {i} half 1" for i in batch["ids"]]
    return check_batch(batch, arrays, "ids")


@pytest.mark.parametrize("fmt", format_cases("training_cuts"))
def test_the_lhotse_recipe_codes_with_the_supervisions_text(outs, fmt):
    """The README's recipe: a lhotse sampler over ``read_cuts`` (with supervisions) and
    ``CutsDataset`` in forked workers: codes padded, lengths, masks, ids and each cut's text."""
    sampler, arrays = recipe_cuts(outs[fmt])
    loader = torch.utils.data.DataLoader(CutsDataset(), sampler=sampler, batch_size=None, num_workers=WORKERS["fork"],
                                         multiprocessing_context="fork")
    seen = [k for batch in loader for k in check_cuts_batch(batch, arrays)]
    assert sorted(seen) == sorted(arrays) and len(seen) == 7


@pytest.mark.slow
def test_spawned_workers_read_every_format(outs):
    """The two tests above in a spawned worker (a fresh interpreter: the dataset and the cuts
    pickled to it, the package imported anew), every format's OUT through one worker per loader
    (each spawn imports torch and lhotse anew, seconds on 2 cores): an ``OutDataset`` loader over
    the formats' datasets side by side (no batch spans two), and a ``CutsDataset`` loader over
    each format's recipe batches in turn; every batch holds that format's arrays."""
    datasets, batches, owner, want = [], [], [], {}
    for fmt in format_cases("training_batches"):
        dataset, arrays, own = batches_of(outs[fmt])
        start = sum(len(d) for d in datasets)
        datasets.append(dataset)
        batches += [[start + i for i in b] for b in own]
        owner += [(fmt, arrays)] * len(own)
        want[fmt] = sorted(arrays)
    loader = torch.utils.data.DataLoader(torch.utils.data.ConcatDataset(datasets), batch_sampler=batches,
                                         num_workers=WORKERS["spawn"], collate_fn=pad_collate,
                                         multiprocessing_context="spawn")
    seen: dict[str, list] = {}
    for batch, (fmt, arrays) in zip(loader, owner, strict=True):
        seen.setdefault(fmt, []).extend(check_batch(batch, arrays, "key"))
    assert {f: sorted(k) for f, k in seen.items()} == want
    cut_batches, owner, want = [], [], {}
    for fmt in format_cases("training_cuts"):
        sampler, arrays = recipe_cuts(outs[fmt])
        mine = list(sampler)
        cut_batches += mine
        owner += [(fmt, arrays)] * len(mine)
        want[fmt] = sorted(arrays)
    loader = torch.utils.data.DataLoader(CutsDataset(), sampler=cut_batches, batch_size=None,
                                         num_workers=WORKERS["spawn"], multiprocessing_context="spawn")
    seen = {}
    for batch, (fmt, arrays) in zip(loader, owner, strict=True):
        seen.setdefault(fmt, []).extend(check_cuts_batch(batch, arrays))
    assert {f: sorted(k) for f, k in seen.items()} == want and all(len(k) == 7 for k in want.values())
