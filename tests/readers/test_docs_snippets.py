"""The training scripts of docs/outputs.md run as written: each is cut out of the page (the
Python block that holds a line named here) and run as a file of its own, in a fresh interpreter, in
a folder that holds the OUT under the name the script uses.  A script that needs an edit to run is
a defect of the docs (issue 41: the DataLoader script had no ``__main__`` guard, so spawned
workers failed; the GPTDataset one raised "Default process group has not been initialized" and
needed a tokenizer the page did not show)."""

import os
import re
import subprocess
import sys

import pytest

from support import ROOT, extract
from mimi_extract.config.settings import Settings

# what makes a DataLoader spawn its workers in this script as it does by default on macOS and Windows
# (and where CUDA is initialised); prepended, not edited in: the script itself runs as the page has it
SPAWN = 'import multiprocessing; multiprocessing.set_start_method("spawn", force=True)\n'


def snippet(page: str, line: str) -> str:
    """The ```python block of ``docs/<page>`` that holds ``line`` (exactly one)."""
    text = open(os.path.join(ROOT, "docs", page)).read()
    found = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if line in b]
    assert len(found) == 1, f"{len(found)} python blocks of docs/{page} hold {line!r}"
    return found[0]


def run_script(folder, source: str, name: str) -> subprocess.CompletedProcess:
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, path], cwd=folder, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_the_dataloader_script_runs_with_spawned_workers(corpus, tiny_model_dir, tmp_path):
    """docs/outputs.md's DataLoader script (OutDataset, then lhotse's sampler with CutsDataset)
    over a codes OUT, its workers spawned: every worker imports the script again, which the
    ``__main__`` guard keeps from starting workers of its own.  One worker per loader where the page
    says 4: each spawned worker costs seconds of imports, and one proves the spawn, the pickling and
    the guard (several workers sharing an OUT: tests/readers/test_training.py)."""
    pytest.importorskip("lhotse")
    root, _ = corpus
    assert extract(root, str(tmp_path / "out"), Settings(model=tiny_model_dir, tap="codes", num_workers=0)).ok == 7
    script = snippet("outputs.md", "DataLoader(OutDataset(\"out\")")
    assert script.count("num_workers=4") == 2, script
    done = run_script(tmp_path, SPAWN + script.replace("num_workers=4", "num_workers=1")
                      + "\nprint('read every batch')\n", "train.py")
    assert done.returncode == 0 and "read every batch" in done.stdout, done.stderr[-3000:]


def test_the_gpt_dataset_script_runs_as_written(corpus, tiny_model_dir, tmp_path):
    """docs/outputs.md's GPTDataset script: megatron-core's BlendedMegatronDatasetBuilder over
    ``megatron_blend`` of a 3-shard Megatron OUT (token counts as weights), with the cache path the
    page recommends, megatron-core's NullTokenizer and a one-process gloo group; its cache lands in
    the folder it names, not in OUT.  The samples themselves are held to the HDF5 codes by
    tests/formats/test_megatron.py."""
    pytest.importorskip("megatron.core.datasets.gpt_dataset")
    root, _ = corpus
    out = tmp_path / "tokens"
    settings = Settings(model=tiny_model_dir, tap="codes", num_workers=0, format="megatron")
    assert extract(root, str(out), settings, shard_size=3).ok == 7
    before = sorted(os.listdir(out))
    assert sum(name.endswith(".idx") for name in before) == 3  # a blend of several shards (one hid the bug)
    done = run_script(tmp_path, snippet("outputs.md", "BlendedMegatronDatasetBuilder(GPTDataset")
                      + "\nprint(sample['tokens'].tolist())\n", "blend.py")
    assert done.returncode == 0, done.stderr[-3000:]
    tokens = [int(t) for t in done.stdout.strip().splitlines()[-1].strip("[]").split(",")]
    assert len(tokens) == 16 and all(0 <= t < 8 * 64 for t in tokens)  # the tiny model's 8 x 64 flat ids
    assert os.listdir(tmp_path / "megatron-cache") and sorted(os.listdir(out)) == before
