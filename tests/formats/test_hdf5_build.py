"""An HDF5 shard as the writer builds it (``formats.hdf5.HDF5Shard``, through h5py's low-level calls
since issue 40) is byte for byte the shard h5py's own ``create_dataset``/``attrs.create`` make for the
same items: every shape, dtype and key a run stores, the segment attributes, empty arrays, the run's
attributes (strings, bools, ints, floats), non-ASCII names."""

import uuid

import h5py
import numpy as np
import pytest
from hypothesis import given, strategies as st

from mimi_extract.formats.hdf5 import HDF5Shard, write_attrs
from mimi_extract.formats.records import StoredRow
from mimi_extract.sources.keys import dataset_name

FILE_ATTRS = {"tap": "codes", "frame_rate": 12.5, "sample_rate": 24000, "model": "kyutai/mimi",
              "config_hash": "290392974bf177a3", "weights": "da6b0984e74bde55afe6b912", "tool_version": "0.4.0",
              "dtype": "fp32", "framing": "transformers", "layout": "[frames, num_quantizers]", "num_quantizers": 8,
              "fidelity": True, "metadata": '{"speaker": "str", "text": "str"}', "empty": ""}


def reference_attrs(attrs: h5py.AttributeManager, values: dict) -> None:
    """0.3.1's attributes through h5py's high-level API: strings fixed-length UTF-8, the rest as h5py
    stores them."""
    for name, value in values.items():
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogateescape")
            size = max(len(raw), 1)
            attrs.create(name, np.array(raw, dtype=f"S{size}"), dtype=h5py.string_dtype("utf-8", size))
        else:
            attrs[name] = value


def memory_file() -> h5py.File:
    return h5py.File(f"mem-{uuid.uuid4().hex}.h5", "w", driver="core", backing_store=False, libver=("v110", "v110"))


def reference_add(f: h5py.File, key: str, data: np.ndarray, attrs: dict) -> None:
    """0.3.1's ``HDF5Shard.add``: the dataset is closed when it returns, before the next one is made
    (the order decides where HDF5 puts each chunk)."""
    ds = f.create_dataset(dataset_name(key), data=data, fletcher32=data.size > 0)
    reference_attrs(ds.attrs, {**attrs, "key": key})


def reference_image(file_attrs: dict, items: list) -> bytes:
    """The shard 0.3.1 built: ``create_dataset(data=..., fletcher32=...)`` and ``attrs.create``."""
    f = memory_file()
    try:
        reference_attrs(f.attrs, file_attrs)
        for key, data, attrs in items:
            reference_add(f, key, data, attrs)
        f.flush()
        return f.id.get_file_image()
    finally:
        f.close()


def built_image(file_attrs: dict, items: list) -> bytes:
    shard = HDF5Shard(file_attrs)
    try:
        for key, data, attrs in items:
            assert shard.add(key, data, StoredRow(key, dataset=dataset_name(key)), attrs) == {}
        return shard.files("shard-00000.h5")["shard-00000.h5"]
    finally:
        shard.close()


def item(i: int, data: np.ndarray, segment: bool = False, key: str | None = None):
    attrs = {"duration": len(data) / 12.5 + 0.0123, "source_sample_rate": (16_000, 44_100, 48_000)[i % 3]}
    if segment:
        attrs.update(start=1.25 * i, end=1.25 * i + 0.5)
    return key or f"spk{i % 7}/utt{i:05d}.flac", data, attrs


def test_a_run_of_codes_and_latents_is_the_reference_shard():
    rng = np.random.default_rng(0)
    codes = [item(i, rng.integers(0, 2048, (int(f), 8), dtype=np.int16), segment=i % 4 == 0)
             for i, f in enumerate(rng.integers(1, 400, 60))]
    codes += [item(60, np.zeros((0, 8), np.int16)), item(61, np.zeros((1, 8), np.int16), key="é/ü.wav#ch1"),
              item(62, np.arange(16, dtype=np.int16).reshape(2, 8), key=".hidden%2F/a b.mp3")]
    assert built_image(FILE_ATTRS, codes) == reference_image(FILE_ATTRS, codes)
    for dtype in (np.float32, np.float16):
        latents = [item(i, rng.standard_normal((int(f), 512)).astype(dtype)) for i, f in enumerate((1, 7, 250, 3000))]
        latents.append(item(9, np.zeros((0, 512), dtype)))
        assert built_image({**FILE_ATTRS, "tap": "latent"}, latents) == reference_image({**FILE_ATTRS, "tap": "latent"},
                                                                                        latents)


@given(st.lists(st.tuples(st.integers(0, 700), st.integers(1, 40), st.sampled_from(["int16", "float32", "float16"]),
                          st.text(min_size=1, max_size=30), st.booleans()), min_size=1, max_size=6, unique_by=lambda t: t[3]),
       st.dictionaries(st.text(st.characters(codec="ascii", exclude_characters="\0."), min_size=1, max_size=12),
                       st.one_of(st.text(max_size=40), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                                 st.booleans()), max_size=5))
def test_any_items_and_attributes_are_the_reference_shard(items, extra):
    rng = np.random.default_rng(len(items))
    made = [item(i, rng.integers(-9, 9, (frames, dims)).astype(dtype), segment, key=f"k{i}/{key}")
            for i, (frames, dims, dtype, key, segment) in enumerate(items)]
    assert built_image({**FILE_ATTRS, **extra}, made) == reference_image({**FILE_ATTRS, **extra}, made)


def test_shapes_made_again_in_later_shards_are_the_reference_shard():
    """The dataspace and creation property list of a shape are made once per process and reused by
    every later item and shard of that shape (``_dataset_creation``, issue 40): a shard built after
    others with the same shapes is still the reference, with attribute creation order tracked or not."""
    rng = np.random.default_rng(1)
    shapes = [(int(f), 8) for f in rng.integers(1, 60, 40)] + [(0, 8), (3, 8), (3, 8), (0, 8)]
    for shard in range(3):
        codes = [item(i, rng.integers(0, 2048, shape, dtype=np.int16)) for i, shape in enumerate(shapes)]
        assert built_image(FILE_ATTRS, codes) == reference_image(FILE_ATTRS, codes), shard
    config = h5py.get_config()
    config.track_order = True
    try:
        codes = [item(i, rng.integers(0, 2048, shape, dtype=np.int16)) for i, shape in enumerate(shapes)]
        assert built_image(FILE_ATTRS, codes) == reference_image(FILE_ATTRS, codes)
    finally:
        config.track_order = False


def test_a_value_that_is_not_a_string_or_a_number_is_refused():
    f = memory_file()
    try:
        with pytest.raises(TypeError, match="not a string or a number"):
            write_attrs(f.id, {"shape": [1, 2]})
    finally:
        f.close()
