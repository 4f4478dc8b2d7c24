"""torch's OpenMP threads wait passively in the processes the tool starts (mimi_extract.common.threads):
``OMP_WAIT_POLICY=PASSIVE`` is in the environment before torch (and its libgomp, which reads it once)
is imported, in the console entry point's process and in a spawned worker, and a user's own
setting is kept."""

import multiprocessing
import os

import pytest

from mimi_extract import _boot
from mimi_extract.common.threads import passive_openmp
from support import entry_point_report

# runs the console entry point as `mimi-extract` would, and reports the policy in the environment at
# the moment torch is first imported (an audit hook sees every import), then ends the process there:
# what the test asks is known then (torch's import and the run after it cost seconds of CPU and show
# nothing more); a run that never imports torch ends as the entry point returns
AT_TORCH_IMPORT = r"""
import json, os, sys
def hook(event, args):
    if event == "import" and args[0] == "torch":
        print(json.dumps({"policy_at_torch_import": os.environ.get("OMP_WAIT_POLICY")}), flush=True)
        os._exit(0)
sys.addaudithook(hook)
sys.argv = ["mimi-extract", *sys.argv[1:]]
from mimi_extract import _entry
try:
    code = _entry.run()
except SystemExit as e:
    code = e.code
print(json.dumps({"policy_at_torch_import": "torch never imported", "exit": code}))
"""


def _entry_run(tmp_path, tiny_model_dir, env_policy):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    return entry_point_report(AT_TORCH_IMPORT, tmp_path, tiny_model_dir, env)["policy_at_torch_import"]


def test_the_console_entry_point_sets_a_passive_wait_before_torch_loads(tmp_path, tiny_model_dir):
    assert _entry_run(tmp_path, tiny_model_dir, None) == "PASSIVE"


def test_a_users_own_wait_policy_is_kept(tmp_path, tiny_model_dir):
    assert _entry_run(tmp_path, tiny_model_dir, "ACTIVE") == "ACTIVE"
    environ = {"OMP_WAIT_POLICY": "active"}
    assert passive_openmp(environ) == "active" and environ == {"OMP_WAIT_POLICY": "active"}
    environ = {}
    assert passive_openmp(environ) == "PASSIVE" and environ == {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("parent_policy", [None, "ACTIVE"])
def test_a_spawned_worker_starts_with_a_passive_wait(monkeypatch, parent_policy):
    """A parent that is not the console entry point (a library caller, a benchmark) may not have
    set it: the worker sets it itself before its imports; a parent's own setting reaches it as is."""
    if parent_policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", parent_policy)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_boot.worker_main, args=(os.getpid(), None, "support.probes:report_environment", queue))
    proc.start()
    try:
        seen = queue.get(timeout=120)  # (a spawned interpreter's start; generous for a loaded machine)
    finally:
        proc.join(60)
    assert seen == {"OMP_WAIT_POLICY": parent_policy or "PASSIVE"}
