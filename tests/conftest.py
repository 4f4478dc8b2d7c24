"""The suite's settings (threads, offline, hypothesis profiles) and its plugins: the shared fixtures
(``support.fixtures``: models, the demo corpus, Ray, an empty working directory per test) and the
packaged corpora (``support.corpora``).  Helpers are imported from ``support``, never from a test
module or this file."""

import os

from mimi_extract.common.threads import passive_openmp

# torch's OpenMP threads wait passively, as in the tool's own processes (before torch loads libgomp;
# the CLI subprocesses inherit it): spinning threads on a busy machine burn the cores the rest of the
# suite needs
passive_openmp()

import hypothesis  # noqa: E402
import torch  # noqa: E402

pytest_plugins = ("support.fixtures", "support.corpora")

torch.set_num_threads(2)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# property-based fuzzing (the parsers the tool owns): a small budget per test in the suite; a longer
# run with HYPOTHESIS_PROFILE=long (docs/inputs.md says how long it ran and what it found)
hypothesis.settings.register_profile("suite", max_examples=30, deadline=None)
hypothesis.settings.register_profile("long", max_examples=3000, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))
