"""Loading a model: one rule says whether ``--model`` names a directory or a Hub id, for the offline
check (``hub.offline_problem``, before OUT is touched) and for loading (``model.from_pretrained``)."""

import pytest
from transformers import MimiModel

from mimi_extract.codec.hub import looks_local, offline_problem
from mimi_extract.codec.model import from_pretrained


@pytest.mark.parametrize("name, local", [
    ("kyutai/mimi", False), ("mimi", False), ("tiny", False),  # Hub ids: name or org/name
    ("./tiny", True), ("../models/mimi", True), ("/abs/mimi", True), ("~/mimi", True), (".", True),
    ("models/kyutai/mimi", True), ("kyutai//mimi", True),  # more than one '/': a path
])
def test_one_rule_says_what_names_a_directory(name, local):
    assert looks_local(name) is local


def test_a_missing_directory_is_said_missing_by_both(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = str(tmp_path / "no" / "such" / "model")
    assert "the directory does not exist" in offline_problem(missing)
    with pytest.raises(RuntimeError, match="does not exist"):
        from_pretrained(MimiModel, missing)


def test_a_home_directory_is_expanded_by_both(tmp_path, monkeypatch, tiny_model):
    """``~/tiny`` that exists passes the offline check and loads (the check used not to expand ``~``)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny_model.save_pretrained(tmp_path / "tiny")
    assert offline_problem("~/tiny") is None
    assert from_pretrained(MimiModel, "~/tiny").config.hidden_size == tiny_model.config.hidden_size
    assert "the directory does not exist" in offline_problem("~/elsewhere")
