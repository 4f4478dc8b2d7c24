"""The private parts of transformers' Mimi the encoder relies on (``mimi_extract/internals.py``)
are all there; when one disappears (a transformers upgrade), the encoder says which, by name."""

import pytest
import transformers

from mimi_extract.codec import internals
from mimi_extract.codec.encoder import PaddedMimiEncoder


def test_every_internal_the_encoder_relies_on_is_there(tiny_model):
    gone = internals.missing(tiny_model)
    assert gone == [], (
        f"transformers {transformers.__version__} lacks internals the encoder relies on: {gone}; update "
        f"mimi_extract/internals.py (checked on {internals.CHECKED_ON})")


@pytest.mark.parametrize("internal, where", [
    ("_get_output_length", "MimiConv1d"), ("padding_total", "MimiConv1d"), ("_embed", "MimiEuclideanCodebook")])
def test_a_missing_internal_is_named(tiny_model, monkeypatch, internal, where):
    cls = getattr(internals.mm, where)
    if internal in vars(cls):  # a method: hide it on the class
        monkeypatch.delattr(cls, internal)
    else:  # an instance attribute: hide it on every instance
        for m in tiny_model.modules():
            if isinstance(m, cls) and internal in vars(m):
                monkeypatch.delitem(vars(m), internal)
            elif isinstance(m, cls) and internal in m._buffers:
                monkeypatch.delitem(m._buffers, internal)
    assert f"{where}.{internal}" in internals.missing(tiny_model)
    with pytest.raises(RuntimeError, match=rf"{where}\.{internal}.*checked on transformers"):
        PaddedMimiEncoder(tiny_model)


def test_a_renamed_cache_keyword_is_named(tiny_model, monkeypatch):
    monkeypatch.setattr(internals, "CACHE_KEYWORDS", ("kv_cache",))
    assert any("cache keyword" in g for g in internals.missing(tiny_model))
