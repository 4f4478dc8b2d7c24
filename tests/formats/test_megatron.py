"""--format megatron: codes as token ids in Megatron indexed datasets (.bin/.idx), written by
megatron-core's own builder and read back by megatron-core's own readers -- the low-level
IndexedDataset and a GPTDataset (via BlendedMegatronDatasetBuilder over the data-args file, no
distributed setup) -- equal, token for token, to the HDF5 codes of the same corpus; the rest of
the tool on it (readers, lhotse cuts, info, status, report, verify, decode, parts, damage,
refused resumes).  kill -9 / ENOSPC / object storage: test_integrity.py and test_object_storage.py."""

import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import mimi_extract
from support import ONE_WORKER, ROOT, cli
from support import check_consistency
from support.outs import check_decode
from mimi_extract import read, read_manifest
from mimi_extract.formats.megatron import DATA_ARGS, IndexFile, Tokens, indexed_dataset
from mimi_extract.readers.reader import megatron_blend as blend
from support import extract
from mimi_extract.config.choices import MAX_TOKEN_ID
from mimi_extract.config.settings import Settings
from mimi_extract.store.files import DamagedError

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core.datasets.indexed_dataset")

CODEBOOK = 64  # the tiny test model's codebook size
LAYOUTS = {"flat": dict(token_layout="flat", token_offset=0),
           "per-codebook": dict(token_layout="per-codebook", token_offset=1000)}


def run(root, out, model_dir, fmt, **kw):
    return extract(root, str(out), Settings(model=model_dir, tap="codes", num_workers=0, format=fmt, **kw), shard_size=3)


@pytest.fixture(scope="module")
def outs(corpus, tiny_model_dir, tmp_path_factory):
    """The mixed corpus (7 ok items, 3 failing) as HDF5 codes and as Megatron tokens in both layouts
    (3-item shards)."""
    root, _ = corpus
    found = {}
    for name, kw in (("hdf5", {}), *((f"megatron-{layout}", kw) for layout, kw in LAYOUTS.items())):
        found[name] = str(tmp_path_factory.mktemp(name) / "out")
        summary = run(root, found[name], tiny_model_dir, name.split("-")[0], **kw)
        assert summary.ok == 7 and summary.errors == 3, summary
    return found


def expected_tokens(codes: np.ndarray, layout: str, offset: int, size: int) -> list[list[int]]:
    """The sequences of one item's document, written out from the documented arithmetic (loops, not
    the format's own code): flat, per frame t and codebook k, offset + k*size + c[t, k]; per-codebook,
    one sequence per codebook k of offset + c[t, k]."""
    frames, n = codes.shape
    if layout == "flat":
        return [[offset + k * size + int(codes[t, k]) for t in range(frames) for k in range(n)]]
    return [[offset + int(codes[t, k]) for t in range(frames)] for k in range(n)]


# -- the token layouts ---------------------------------------------------------------------------
def test_the_documented_example_and_round_trips():
    codes = np.array([[5, 7, 9], [6, 8, 10]], np.int16)
    flat, per = Tokens("flat", 0, 2048, 3), Tokens("per-codebook", 0, 2048, 3)
    tokens, lengths = flat.encode(codes)
    assert tokens.tolist() == [5, 2055, 4105, 6, 2056, 4106] and lengths == [6]
    tokens, lengths = per.encode(codes)
    assert tokens.tolist() == [5, 6, 7, 8, 9, 10] and lengths == [2, 2, 2]
    assert Tokens("flat", 128256, 2048, 8).vocab_size == 128256 + 8 * 2048
    assert Tokens("per-codebook", 128256, 2048, 8).vocab_size == 128256 + 2048
    rng = np.random.default_rng(0)
    for layout in ("flat", "per-codebook"):
        t = Tokens(layout, 77, 2048, 8)
        for frames in (0, 1, 13):
            codes = rng.integers(0, 2048, (frames, 8)).astype(np.int16)
            tokens, lengths = t.encode(codes)
            assert [list(map(int, s)) for s in np.split(tokens, np.cumsum(lengths)[:-1])] == \
                expected_tokens(codes, layout, 77, 2048)
            back = t.decode(np.split(tokens, np.cumsum(lengths)[:-1]))
            assert back.dtype == np.int16 and np.array_equal(back, codes)
    with pytest.raises(ValueError, match="outside this layout's range"):
        Tokens("flat", 10, 2048, 2).decode([np.array([9, 2058])])  # below the offset
    with pytest.raises(ValueError, match="outside this layout's range"):
        Tokens("per-codebook", 0, 2048, 2).decode([np.array([2048]), np.array([0])])
    with pytest.raises(ValueError, match="one sequence of frames x 2"):
        Tokens("flat", 0, 2048, 2).decode([np.array([1, 2, 3])])
    with pytest.raises(ValueError, match="2 sequences of equal length"):
        Tokens("per-codebook", 0, 2048, 2).decode([np.array([1, 2]), np.array([3])])


def test_the_id_dtype_is_megatron_cores_choice():
    """``Tokens.dtype`` (torch-free, for ``plan``) is megatron-core's ``DType.optimal_dtype`` for the
    layout's vocabulary, on both sides of its uint16/int32 boundary and for both layouts."""
    optimal = indexed_dataset().DType.optimal_dtype
    for layout in LAYOUTS:
        for offset in (0, 49_115, 49_116, 63_451, 63_452, 65_499, 65_500, 128_256, MAX_TOKEN_ID - 2**16):
            tokens = Tokens(layout, offset, 2048, 8)
            assert tokens.dtype == np.dtype(optimal(tokens.vocab_size)).name, (layout, offset)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ids_past_uint16_are_int32_tokens_megatron_core_reads(tmp_path, layout):
    """``--token-offset 128256`` (after Llama 3's vocabulary), Mimi's 8 x 2048 codebooks: megatron-core
    picks int32 for the ids; its reader gets them, mimi-extract's gives the int16 codes back."""
    from types import SimpleNamespace

    from mimi_extract.formats import get_format
    from mimi_extract.store.manifest import ManifestRow
    from mimi_extract.store.writer import ShardWriter

    fmt = get_format("megatron")
    settings = Settings(tap="codes", format="megatron", token_layout=layout, token_offset=128256)
    attrs = {"tap": "codes", "num_quantizers": 8, **fmt.run_settings(settings, SimpleNamespace(codebook_size=2048))}
    assert attrs["token_dtype"] == "int32"
    rng = np.random.default_rng(1)
    items = {f"k{i}": rng.integers(0, 2048, (int(rng.integers(1, 30)), 8)).astype(np.int16) for i in range(5)}
    writer = ShardWriter(str(tmp_path), fmt, attrs, max_items=3)
    for key, codes in items.items():
        writer.add(key, codes, ManifestRow(key=key, path=key, duration=codes.shape[0] * 0.08), {"duration": 1.0})
    writer.close()
    rows = [r for r in read_manifest(str(tmp_path)) if r["status"] == "ok"]
    assert [r["document"] for r in rows] == [0, 1, 2, 0, 1] and len({r["shard"] for r in rows}) == 2
    for r in rows:
        dataset = indexed_dataset().IndexedDataset(str(tmp_path / r["shard"].removesuffix(".idx")))
        first, end = int(dataset.document_indices[r["document"]]), int(dataset.document_indices[r["document"] + 1])
        sequences = dataset[first:end]
        assert sequences[0].dtype == np.int32
        assert [q.tolist() for q in sequences] == expected_tokens(items[r["key"]], layout, 128256, 2048)
        assert np.array_equal(read(str(tmp_path), r["key"]), items[r["key"]])


# -- the .idx reader, held to megatron-core's --------------------------------------------------
def _write(tmp_path, documents: list[list[list[int]]], dtype) -> str:
    """An indexed dataset written by megatron-core's builder: each document a list of sequences."""
    prefix = str(tmp_path / "ds")
    builder = indexed_dataset().IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in documents:
        flat = [t for s in doc for t in s]
        builder.add_document(np.array(flat, dtype=np.int64), [len(s) for s in doc])
    builder.finalize(prefix + ".idx")
    return prefix


documents = st.lists(st.lists(st.lists(st.integers(0, 60_000), max_size=5), max_size=4), max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=documents, dtype=st.sampled_from([np.uint16, np.int32]))
def test_the_index_reader_equals_megatron_cores(tmp_path, docs, dtype):
    prefix = _write(tmp_path, docs, dtype)
    ours = IndexFile.parse(open(prefix + ".idx", "rb").read())
    theirs = indexed_dataset()._IndexReader(prefix + ".idx", multimodal=False)
    assert ours.dtype == np.dtype(theirs.dtype)
    assert np.array_equal(ours.lengths, theirs.sequence_lengths)
    assert np.array_equal(ours.pointers, theirs.sequence_pointers)
    assert np.array_equal(ours.documents, theirs.document_indices)
    assert ours.bin_size == os.path.getsize(prefix + ".bin")
    if not ours.bin_size:
        return  # (megatron-core cannot mmap an empty .bin; every committed shard holds at least one frame)
    dataset = indexed_dataset().IndexedDataset(prefix)  # megatron-core's reader of the tokens themselves
    for d, doc in enumerate(docs):
        seqs = list(ours.sequences(d))
        assert [dataset[s].tolist() for s in seqs] == doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=documents, cut=st.integers(0, 400), flips=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 255)),
                                                               max_size=3), tail=st.binary(max_size=4))
def test_the_index_reader_refuses_damage_with_a_value_error(tmp_path, docs, cut, flips, tail):
    """Truncated, flipped or extended: a ValueError, or (a flip it cannot see, e.g. in a document
    boundary) an index that is still whole: offsets that follow the lengths, boundaries 0..S."""
    prefix = _write(tmp_path, docs, np.uint16)
    data = bytearray(open(prefix + ".idx", "rb").read())
    for at, x in flips:
        if data:
            data[at % len(data)] ^= x
    data = bytes(data[: max(0, len(data) - cut % (len(data) + 1))] if cut % 3 else data) + (tail if cut % 5 == 0 else b"")
    try:
        index = IndexFile.parse(data)
    except ValueError:
        return
    assert index.documents[0] == 0 and index.documents[-1] == len(index.lengths)
    assert np.array_equal(index.pointers[1:], np.cumsum(index.lengths.astype(np.int64) * index.dtype.itemsize)[:-1])


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_are_not_an_index(data):
    with pytest.raises(ValueError):
        IndexFile.parse(data)


# -- megatron-core reads what the HDF5 OUT holds ------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_cores_indexed_dataset_reads_the_hdf5_codes(outs, layout):
    """Every shard through megatron-core's IndexedDataset: document ``row["document"]`` holds the
    item's sequences, equal to the documented arithmetic over the HDF5 OUT's codes of that item."""
    out, kw = outs[f"megatron-{layout}"], LAYOUTS[layout]
    hdf5 = check_consistency(outs["hdf5"])
    arrays = check_consistency(out)
    assert arrays.keys() == hdf5.keys() and len(arrays) == 7
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    seen = set()
    for shard in sorted({r["shard"] for r in rows}):
        dataset = indexed_dataset().IndexedDataset(os.path.join(out, shard.removesuffix(".idx")))
        mine = [r for r in rows if r["shard"] == shard]
        assert len(dataset.document_indices) - 1 == len(mine)
        for r in mine:
            d = r["document"]
            sequences = dataset[int(dataset.document_indices[d]):int(dataset.document_indices[d + 1])]
            assert [s.tolist() for s in sequences] == expected_tokens(hdf5[r["key"]], layout, kw["token_offset"],
                                                                      CODEBOOK), r["key"]
            assert sequences[0].dtype == np.uint16  # megatron-core's choice for a vocabulary below 65,500
            assert np.array_equal(arrays[r["key"]], hdf5[r["key"]]) and arrays[r["key"]].dtype == np.int16
            seen.add(r["key"])
    assert seen == hdf5.keys()
    info = json.load(open(os.path.join(out, "run.json")))
    assert {k: info[k] for k in ("token_layout", "token_offset", "codebook_size", "num_quantizers", "token_dtype")} == {
        **kw, "codebook_size": CODEBOOK, "num_quantizers": 8, "token_dtype": "uint16"}
    shard_json = json.load(open(os.path.join(out, "shard-00000.json")))
    assert shard_json["attrs"]["token_layout"] == layout and shard_json["attrs"]["tap"] == "codes"
    assert [d["key"] for d in shard_json["documents"]] == [r["key"] for r in rows if r["shard"] == "shard-00000.idx"]


class _Tokenizer:
    """What megatron-core's GPTDataset asks of a tokenizer: the vocabulary size, an end-of-document
    and a pad id (outside the audio ids: the pad is masked, never a code)."""

    def __init__(self, vocab: int):
        self.vocab_size, self.eod, self.pad = vocab + 2, vocab, vocab + 1

    @property
    def unique_identifiers(self):
        return {"class": "audio", "vocab_size": self.vocab_size}


def test_a_gpt_dataset_over_the_data_args_file_samples_the_hdf5_tokens(outs, tmp_path):
    """megatron-core's BlendedMegatronDatasetBuilder over the blend OUT/megatron-data-args.txt lists
    (token counts as weights), with no distributed setup: every sample of every GPTDataset (shuffled,
    across document boundaries, over more than one epoch) is the stretch of its documents' tokens
    that its sample index names, each document the HDF5 codes of its item in the flat layout."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    out = str(tmp_path / "out")
    shutil.copytree(outs["megatron-flat"], out)  # (megatron-core caches its indices beside each prefix)
    hdf5 = check_consistency(outs["hdf5"])
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    listed = open(os.path.join(out, DATA_ARGS)).read().split()
    # Megatron-LM's --data-args-path: the file's words, prefixes relative to OUT
    words = [w if i % 2 == 0 else os.path.join(out, w) for i, w in enumerate(listed)]
    prefixes, weights = get_blend_from_list(words)
    tokens = {r["shard"]: 0 for r in rows}
    for r in rows:
        tokens[r["shard"]] += r["frames"] * 8
    assert prefixes == [os.path.join(out, s.removesuffix(".idx")) for s in sorted(tokens)]
    assert weights == [float(tokens[s]) for s in sorted(tokens)] and (prefixes, weights) == blend(out)
    sequence_length = 16
    config = GPTDatasetConfig(random_seed=1234, sequence_length=sequence_length, blend=(prefixes, weights),
                              split="100,0,0", tokenizer=_Tokenizer(8 * CODEBOOK), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False, path_to_cache=None)
    samples = sum(tokens.values()) // sequence_length
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [samples, 0, 0], lambda: True, config).build()
    assert len(train) >= samples and len(train.datasets) == len(prefixes)  # (megatron-core rounds up)
    documents_seen = set()
    for prefix, gpt in zip(prefixes, train.datasets):
        shard = os.path.relpath(prefix, out) + ".idx"
        docs = {r["document"]: expected_tokens(hdf5[r["key"]], "flat", 0, CODEBOOK)[0] for r in rows
                if r["shard"] == shard}
        stream = [t for d in gpt.document_index for t in docs[int(d)]]  # (flat: a sequence is a document)
        starts = np.concatenate([[0], np.cumsum([len(docs[int(d)]) for d in gpt.document_index])])
        for j in range(len(gpt)):
            beg, offset = gpt.sample_index[gpt.shuffle_index[j]]
            at = int(starts[beg] + offset)
            want = stream[at:at + sequence_length + 1]
            sample = gpt[j]
            assert sample["tokens"].tolist() == want[:-1] and sample["labels"].tolist() == want[1:], (shard, j)
        documents_seen |= {(shard, int(d)) for d in gpt.document_index}
    assert documents_seen == {(r["shard"], r["document"]) for r in rows}  # every item is trained on
    for i in range(len(train)):  # the blend hands out those very samples
        sample = train[i]
        gpt = train.datasets[int(train.dataset_index[i])]
        assert sample["tokens"].tolist() == gpt[int(train.dataset_sample_index[i])]["tokens"].tolist()
    check_consistency(out)  # megatron-core's cache folders beside the shards change nothing for mimi-extract


# -- the rest of the tool ---------------------------------------------------------------------------
def test_every_reader_and_command_works_on_megatron(outs, tiny_model, tmp_path):

    out = outs["megatron-per-codebook"]
    with mimi_extract.open(out) as reader:
        assert len(reader) == 7 and [k for k, _ in reader] == reader.keys()
        for key, data in reader:
            assert np.array_equal(data, read(outs["hdf5"], key))
    cuts = mimi_extract.read_cuts(out)  # lhotse loads the documents through mimi-extract's storage backend
    assert len(cuts) == 7
    for cut in cuts:
        assert cut.custom["mimi_codes"].array.storage_type == "mimi_extract_megatron"
        stored = read(out, cut.id)
        assert np.array_equal(cut.load_custom("mimi_codes"), stored), cut.id
        if cut.duration > 0.5:
            assert np.array_equal(cut.truncate(offset=0.16, duration=0.32).load_custom("mimi_codes"), stored[2:6])
    written = cli("cuts", out, "-o", tmp_path / "c.jsonl.gz")  # says what loading them needs
    assert written.exit_code == 0 and "mimi_extract_megatron" in written.text and "register_lhotse_readers()" in written.text
    info = json.loads(cli("info", out, "--json").output)
    assert info["ok"] == 7 and info["errors"] == 3 and info["settings"]["format"] == "megatron"
    assert sorted(info["shards"]) == ["shard-00000.idx", "shard-00001.idx", "shard-00002.idx"]
    assert info["bytes"] == sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)
                                if f.startswith("shard-"))  # .idx + .bin + .json
    assert info["tokens"] == info["frames"] * 8
    status = cli("status", out)
    assert status.exit_code == 0 and "complete: 7 ok, 3 errors" in status.text, status.output
    report = json.loads(cli("report", out, "--json").output)
    hdf5_report = json.loads(cli("report", outs["hdf5"], "--json").output)
    for field in ("items", "errors", "damaged", "frames", "tokens", "subsets", "codebooks"):
        assert report[field] == hdf5_report[field], field  # the same code histograms, read through the tokens
    checks = cli("verify", "--out", out, "--checksums")
    assert checks.exit_code == 0 and "7 stored items read, 7 against their checksums; 0 damaged; PASS" in checks.text
    verify = cli("verify", "--out", out, "--sample", 3, "--device", "cpu")
    assert verify.exit_code == 0 and "FAIL" not in verify.text, verify.output
    check_decode(out, tiny_model, str(tmp_path / "sine.wav"))


def test_light_commands_on_megatron_import_neither_torch_nor_megatron(outs, tmp_path):
    out = outs["megatron-flat"]
    code = ("import sys, runpy\n"
            f"for argv in {[['info', out], ['status', out], ['report', out, '--json'], ['cuts', out, '-o', str(tmp_path / 'c.jsonl')]]!r}:\n"
            "    sys.argv = ['mimi-extract'] + argv\n"
            "    try:\n"
            "        runpy.run_module('mimi_extract', run_name='__main__')\n"
            "    except SystemExit as stop:\n"
            "        assert not stop.code, (argv, stop.code)\n"
            "print('HEAVY=' + ','.join(m for m in ('torch', 'transformers', 'megatron') if m in sys.modules))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0 and p.stdout.strip().endswith("HEAVY="), p.stdout[-2000:] + p.stderr[-2000:]


def test_token_settings_are_checked_and_a_resume_that_changes_them_is_refused(outs, corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    features = cli("features", root, str(tmp_path / "f"), "--model", tiny_model_dir, "--format", "megatron", *ONE_WORKER)
    assert features.exit_code == 2 and "--format megatron writes token ids, made from codes only" in features.text
    assert len(features.output.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "f")
    with pytest.raises(ValueError, match="--format megatron writes token ids, made from codes only, not latent"):
        extract(root, str(tmp_path / "f"), Settings(model=tiny_model_dir, tap="latent", format="megatron"))
    assert not os.path.exists(tmp_path / "f")  # (the Python API: refused before anything is encoded)
    other = cli("codes", root, str(tmp_path / "h"), "--model", tiny_model_dir, "--token-offset", 5, *ONE_WORKER)
    assert other.exit_code == 2 and "--token-layout and --token-offset are for a format that writes token ids (--format megatron)" in other.text
    out = str(tmp_path / "out")
    shutil.copytree(outs["megatron-flat"], out)
    for flags, change in ((["--token-offset", 5], "token_offset: 0 -> 5"),
                          (["--token-layout", "per-codebook"], "token_layout: 'flat' -> 'per-codebook'"),
                          (["-q", 4], "num_quantizers: 8 -> 4")):
        result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "megatron", *flags, *ONE_WORKER)
        assert result.exit_code == 2 and change in result.text, result.output
    # run.json deleted: the shards' .json still say what the run wrote
    os.remove(os.path.join(out, "run.json"))
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "megatron", "--token-offset", 5, *ONE_WORKER)
    assert result.exit_code == 2 and "was made with other settings than this run (token_offset: 0 -> 5" in result.text
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "megatron", "--shard-size", 3, *ONE_WORKER)
    assert result.exit_code == 0 and "(7 already done)" in result.text, result.output


def test_damaged_megatron_shards_are_found_quarantined_and_redone(outs, corpus, tiny_model_dir, tmp_path):
    root, _ = corpus
    out = str(tmp_path / "out")
    shutil.copytree(outs["megatron-flat"], out)
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    victim = next(r for r in rows if r["key"] == "sub/deeper/chirp.flac")
    index = IndexFile.parse(open(os.path.join(out, victim["shard"]), "rb").read())
    at = int(index.pointers[index.documents[victim["document"]]]) + 3  # a byte of the victim's tokens
    path = os.path.join(out, victim["shard"].removesuffix(".idx") + ".bin")
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))  # (a low bit: still an id of the layout, only the checksum sees it)
    with pytest.raises(DamagedError) as e:
        read(out, victim["key"])
    assert out in str(e.value) and repr(victim["key"]) in str(e.value) and victim["shard"] in str(e.value)
    result = cli("verify", "--out", out, "--checksums")
    assert result.exit_code == 1 and "1 damaged; FAIL" in result.text and victim["key"] in result.text, result.output
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "megatron", "--shard-size", 3,
                 "--reencode-damaged", *ONE_WORKER)
    assert result.exit_code == 0 and "fail their checksums" in result.text and "moved damaged shard" in result.text
    assert cli("verify", "--out", out, "--checksums").exit_code == 0
    # a truncated index, a .bin cut short, a missing .json: a plain resume quarantines each with its companions
    shards = sorted({r["shard"] for r in read_manifest(out) if r["status"] == "ok"})
    with open(os.path.join(out, shards[0]), "r+b") as f:
        f.truncate(40)
    with open(os.path.join(out, shards[1].removesuffix(".idx") + ".bin"), "r+b") as f:
        f.truncate(10)
    os.remove(os.path.join(out, shards[2].removesuffix(".idx") + ".json"))
    result = cli("codes", root, out, "--model", tiny_model_dir, "--format", "megatron", "--shard-size", 3, *ONE_WORKER)
    assert result.exit_code == 0 and result.text.count("moved damaged shard") == 3, result.output
    quarantined = sorted(os.listdir(os.path.join(out, "quarantine")))
    for shard in shards[:2]:
        assert {shard, shard.replace(".idx", ".bin"), shard.replace(".idx", ".json")} <= set(quarantined), quarantined
    arrays, reference = check_consistency(out), check_consistency(outs["hdf5"])
    assert arrays.keys() == reference.keys() and all(np.array_equal(arrays[k], reference[k]) for k in arrays)
    assert blend(out)[0] == [os.path.join(out, s.removesuffix(".idx"))
                             for s in sorted({r["shard"] for r in read_manifest(out) if r["status"] == "ok"})]


def test_parts_write_one_data_args_file_over_every_part(corpus, tiny_model_dir, outs, tmp_path):
    from mimi_extract.config.settings import Part

    root, _ = corpus
    out = str(tmp_path / "parts")
    for i in range(2):
        extract(root, out, Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="megatron"),
                part=Part(i, 2))
    lines = open(os.path.join(out, DATA_ARGS)).read().split("\n")
    assert lines[-1] == "" and all(line.split()[1].startswith("part-") for line in lines[:-1])
    rows = [r for r in read_manifest(out) if r["status"] == "ok"]
    assert sorted(line.split()[1] for line in lines[:-1]) == sorted({r["shard"].removesuffix(".idx") for r in rows})
    assert sum(int(line.split()[0]) for line in lines[:-1]) == sum(r["frames"] for r in rows) * 8
    arrays, reference = check_consistency(out), check_consistency(outs["hdf5"])
    assert arrays.keys() == reference.keys() and all(np.array_equal(arrays[k], reference[k]) for k in arrays)
    for prefix in blend(out)[0]:  # megatron-core opens every part's shards
        assert len(indexed_dataset().IndexedDataset(prefix)) > 0
