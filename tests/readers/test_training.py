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


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: a fresh interpreter per worker
@pytest.mark.parametrize("fmt", format_cases("training_batches"))
def test_out_dataset_and_pad_collate_in_workers(outs, fmt, context):
    out = outs[fmt]
    dataset = mimi_extract.open(out).dataset()
    pickle.loads(pickle.dumps(dataset))  # 'Can't pickle local object Reader.dataset.<locals>.OutDataset' before
    arrays = {k: read(out, k) for k in dataset.keys}
    assert len({a.shape[0] for a in arrays.values()}) > 1  # items of different lengths
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=WORKERS[context], collate_fn=pad_collate,
                                         multiprocessing_context=context)
    seen = [k for batch in loader for k in check_batch(batch, arrays, "key")]
    assert sorted(seen) == sorted(arrays)
    # a pad value no codebook uses; the same through OutDataset(path)
    batch = PadCollate(pad_value=-1)([OutDataset(out)[i] for i in range(len(dataset))])
    check_batch(batch, arrays, "key", pad_value=-1)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: a fresh interpreter per worker
@pytest.mark.parametrize("fmt", format_cases("training_cuts"))
def test_the_lhotse_recipe_codes_with_the_supervisions_text(outs, fmt, context):
    """The README's recipe: a lhotse sampler over ``read_cuts`` (with supervisions) and
    ``CutsDataset``: codes padded, lengths, masks, ids and each cut's text."""
    from lhotse import SupervisionSegment
    from lhotse.dataset import DynamicBucketingSampler

    out = outs[fmt]
    cuts = mimi_extract.read_cuts(out).to_eager()
    for c in cuts:
        c.supervisions = [SupervisionSegment(f"{c.id}-{j}", c.recording_id, start=j * c.duration / 2,
                                             duration=c.duration / 2, text=f"{c.id} half {j}") for j in (1, 0)]
    sampler = DynamicBucketingSampler(cuts, max_duration=6.0, num_buckets=2, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(CutsDataset(), sampler=sampler, batch_size=None, num_workers=WORKERS[context],
                                         multiprocessing_context=context)
    arrays = {c.id: read(out, c.id) for c in cuts}
    seen = []
    for batch in loader:
        seen += check_batch(batch, arrays, "ids")
        assert batch["text"] == [f"{i} half 0 {i} half 1" for i in batch["ids"]]
    assert sorted(seen) == sorted(arrays) and len(seen) == 7
