"""Discovery, header probing and batch planning."""

import random

from mimi_extract.discover import Item, find_audio, padding_fraction, plan_batches, probe


def items(lengths):
    return [Item(f"/x/{i}.wav", f"{i}.wav", f"{i}.wav", "mix", 24_000, n) for i, n in enumerate(lengths)]


def test_plan_batches_budget_cap_and_coverage():
    rng = random.Random(0)
    todo = items([rng.randint(1000, 24_000 * 20) for _ in range(500)])
    batches = plan_batches(todo, max_batch_seconds=60, batch_size=16)
    assert sorted(it.key for b in batches for it in b) == sorted(it.key for it in todo)
    for b in batches:
        assert len(b) <= 16
        assert len(b) == 1 or len(b) * max(it.samples for it in b) <= 60 * 24_000
    # sorting by length keeps padding far below packing in arrival order
    unsorted = [todo[i : i + 16] for i in range(0, len(todo), 16)]
    assert padding_fraction(batches) < 0.1 < padding_fraction(unsorted)


def test_plan_batches_long_item_alone():
    batches = plan_batches(items([24_000 * 100, 1000, 2000]), max_batch_seconds=10, batch_size=8)
    assert [len(b) for b in batches] == [2, 1]


def test_find_and_probe(corpus):
    root, described = corpus
    rels = sorted(p[len(root) + 1 :] for p in find_audio(root))
    assert rels == sorted(described)  # notes.txt ignored, sub-directories walked
    by_rel = {rel: probe(f"{root}/{rel}", root) for rel in rels}
    assert "empty" in by_rel["empty.wav"][0].error
    assert "corrupt" in by_rel["corrupt.wav"][0].error
    assert "zero-length" in by_rel["zero_len.wav"][0].error
    assert by_rel["rate16k.wav"][0].samples == 48_000  # header length converted to 24 kHz
    each = probe(f"{root}/stereo.wav", root, "each")
    assert [it.key for it in each] == ["stereo.wav#ch0", "stereo.wav#ch1"]
