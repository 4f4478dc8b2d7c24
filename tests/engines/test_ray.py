"""--engine ray on a real local Ray cluster (CPU actors): in-process runs on the session's cluster
(conftest's ``ray_cluster``), the CLI in a subprocess on the private cluster the engine starts itself."""

import os
import signal
import threading
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("ray")

from support import extract  # noqa: E402
from mimi_extract.config.settings import Settings  # noqa: E402
from mimi_extract.engines.ray import RayEngine  # noqa: E402
from mimi_extract.store.writer import ShardSpec, ShardWriter  # noqa: E402
from support import check_consistency  # noqa: E402
from support import write_noise  # noqa: E402
from support.waits import read_until, wait_for  # noqa: E402


@pytest.fixture(scope="module")
def corpus60(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-corpus")
    rng = np.random.default_rng(5)
    for i in range(60):
        n = int(24_000 * (0.3 + 1.5 * rng.random()))
        write_noise(root / f"r{i:02d}.wav", n, rng=rng)
    write_noise(root / "long.wav", 24_000 * 9, rng=rng, level=0.1)  # streamed
    return str(root)


@pytest.fixture(scope="module")
def in_process(corpus60, tiny_model_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ray-ref") / "out")
    extract(corpus60, out, Settings(model=tiny_model_dir, tap="codes", num_workers=1, chunk_seconds=2))
    return check_consistency(out)


def ray_settings(model_dir):
    return Settings(model=model_dir, tap="codes", num_workers=1, chunk_seconds=2, engine="ray", ray_cpu_actors=2)


def driver_writes(monkeypatch) -> dict[str, list]:
    """What the driver's writer is given: whole items to store itself (``add``), shards the actors
    wrote (``commit_prepared``)."""
    seen: dict[str, list] = {"add": [], "prepared": []}
    add, prepared = ShardWriter.add, ShardWriter.commit_prepared

    def spy_add(self, key, *args, **kwargs):
        seen["add"].append(key)
        return add(self, key, *args, **kwargs)

    def spy_prepared(self, shard):
        seen["prepared"].append(shard.name)
        return prepared(self, shard)

    monkeypatch.setattr(ShardWriter, "add", spy_add)
    monkeypatch.setattr(ShardWriter, "commit_prepared", spy_prepared)
    return seen


@pytest.mark.slow
def test_ray_engine_equals_in_process(corpus60, tiny_model_dir, in_process, ray_cluster, tmp_path, monkeypatch):
    """The actors (on this machine: they see OUT) write their shards themselves; the driver commits
    them (every item here whole: the driver stores only pieces of split recordings and error rows)."""
    out = str(tmp_path / "out")
    seen = driver_writes(monkeypatch)
    summary = extract(corpus60, out, ray_settings(tiny_model_dir))
    # threads per actor: the cluster's CPUs (the session cluster's logical CPUs) / 2 actors
    threads = max(1, int(ray_cluster.cluster_resources()["CPU"]) // 2)
    assert summary.ok == 61 and summary.engine == f"2 Ray actors on CPU ({threads} threads each)"
    assert seen["add"] == [] and seen["prepared"], seen
    assert not any("driver writes" in n for n in summary.engine_notes), summary.engine_notes
    got = check_consistency(out, in_process.keys())
    assert all(np.array_equal(got[k], in_process[k]) for k in in_process)


@pytest.mark.slow
def test_ray_actors_that_do_not_see_out_hand_their_items_to_the_driver(corpus60, tiny_model_dir, in_process,
                                                                      ray_cluster, tmp_path, monkeypatch):
    """An actor on a machine without OUT's folder (here: a probe no actor can see, as on another
    machine's disk) writes nothing there; the driver stores its items, with the same result."""
    out = str(tmp_path / "out")
    seen = driver_writes(monkeypatch)
    monkeypatch.setattr(ShardSpec, "with_probe", lambda spec: replace(spec, probe=f"seen.{'0' * 32}.tmp"))
    summary = extract(corpus60, out, ray_settings(tiny_model_dir))
    assert summary.ok == 61 and sorted(seen["add"]) == sorted(in_process) and not seen["prepared"], seen
    assert any("does not see OUT's run directory" in n for n in summary.engine_notes), summary.engine_notes
    got = check_consistency(out, in_process.keys())
    assert all(np.array_equal(got[k], in_process[k]) for k in in_process)


@pytest.mark.slow
def test_ray_actor_killed_mid_run(corpus60, tiny_model_dir, in_process, ray_cluster, tmp_path, monkeypatch):
    """kill -9 of an actor right after it returned a unit whose items it still holds in its open shard
    (not written: shards fill across units), while it has the next unit in hand: both are encoded
    again by the others, nothing lost, nothing stored twice."""
    out = str(tmp_path / "out")
    done, killed = [], []
    delivered = RayEngine._delivered

    def progress(items, seconds, errors):
        done.append(items)

    def kill_a_holder(self, result, spec, book):
        if result.held and not killed:
            os.kill(result.pid, signal.SIGKILL)
            killed.append(len(result.held))
        yield from delivered(self, result, spec, book)

    monkeypatch.setattr(RayEngine, "_delivered", kill_a_holder)
    summary = extract(corpus60, out, ray_settings(tiny_model_dir), shard_size=5, on_progress=progress)
    assert killed, "no actor held items"
    assert sum(done) == 61, done  # every item reported once, though one actor died mid-run
    assert any("died" in n for n in summary.engine_notes), summary.engine_notes
    got = check_consistency(out, in_process.keys())  # nothing lost, nothing twice
    assert all(np.array_equal(got[k], in_process[k]) for k in in_process)


@pytest.mark.slow
def test_ray_interrupted_then_resumed(corpus60, tiny_model_dir, in_process, ray_cluster, tmp_path):
    """A stop (what Ctrl-C sets) mid-run on the Ray engine commits what was completely encoded; the
    units in flight are dropped and encoded again on resume, which completes to the in-process run."""
    out = str(tmp_path / "out")
    stop = threading.Event()
    done = []

    def progress(items, seconds, errors):
        done.append(items)
        if sum(done) >= 10:
            stop.set()

    summary = extract(corpus60, out, ray_settings(tiny_model_dir), shard_size=3, on_progress=progress, stop=stop)
    committed = check_consistency(out)
    assert 0 < len(committed) < 61 and summary.ok == len(committed), (len(committed), summary.ok)
    assert all(np.array_equal(committed[k], in_process[k]) for k in committed)
    again = extract(corpus60, out, ray_settings(tiny_model_dir), shard_size=3)
    assert again.skipped == len(committed) and again.ok == 61 - len(committed)
    got = check_consistency(out, in_process.keys())
    assert all(np.array_equal(got[k], in_process[k]) for k in in_process)


@pytest.mark.slow
def test_ray_driver_killed_takes_its_private_cluster(corpus60, tiny_model_dir, in_process, ray_cluster, tmp_path,
                                                    monkeypatch):
    """kill -9 of a driver that started a private local cluster, mid-run (shards committed, two
    actors writing their own): every process of that cluster (GCS, raylet, workers, and Ray's
    dashboard and runtime-env agents, which Ray itself leaves running for good) is gone within
    seconds, killed by the reaper the driver started; a resume then completes OUT exactly.  The
    private cluster has every core of the machine, shared by the two actors (the plan line, printed
    before the actors start), and its actors run at the driver's niceness, not 15 more (no
    ``RAY_worker_niceness`` given: conftest's is taken away for this driver, which runs 3 nicer
    than the tests, so that an increment of its own niceness would show too)."""
    import ray  # noqa: F401  (its bundled psutil)
    import psutil

    from support import cli_process

    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    out = tmp_path / "out"
    driver = cli_process("codes", corpus60, out, "--model", tiny_model_dir, "--device", "cpu", "--engine", "ray",
                         "--ray-cpu-actors", 2, "--chunk-seconds", 2, "--shard-size", 3, start_new_session=True,
                         preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL), os.nice(3)))
    plan = read_until(driver.stdout, "to encode", "the driver's plan line")[-1]  # (one line: never wrapped)
    tree: dict[int, tuple[float, str]] = {}

    def look():
        for p in psutil.Process(driver.pid).children(recursive=True):
            try:
                tree[p.pid] = (p.create_time(), " ".join(p.cmdline()))
            except psutil.Error:
                pass

    def started():  # every process of the private cluster the reaper must take down, not a guessed second more
        assert driver.poll() is None, driver.stdout.read()
        look()
        names = " ".join(cmd for _, cmd in tree.values())
        return all(n in names for n in ("RayEncoder", "DashboardAgent", "RuntimeEnvAgent"))

    def committed():  # a shard under its final name: its rows are in the manifest (appended before the rename)
        return any(out.glob("shard-*.h5"))

    wait_for(lambda: started() and committed(), "the private cluster's processes and a committed shard", poll=0.2)
    names = " ".join(cmd for _, cmd in tree.values())
    assert "RayEncoder" in names and "DashboardAgent" in names and "RuntimeEnvAgent" in names, names
    # (at 16 or more, as under `nice -n 19`, the driver's +3 and Ray's +15 both reach 19: this then shows nothing)
    niceness = {psutil.Process(pid).nice() for pid, (_, cmd) in tree.items() if "RayEncoder" in cmd}
    assert niceness == {psutil.Process(driver.pid).nice()}, niceness
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()

    def alive():
        left = []
        for pid, (created, cmd) in tree.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(cmd[:60])
            except psutil.Error:
                pass
        return left

    try:
        wait_for(lambda: not alive(), "the private cluster taken down", poll=0.5)
    except AssertionError:
        pass  # (named below, after they are killed)
    left = alive()
    for pid, (created, _) in tree.items():  # never leave them to the next test
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                p.kill()
        except psutil.Error:
            pass
    assert not left, left
    from mimi_extract.config.settings import cpu_cores

    assert f"2 Ray actors on CPU ({max(1, cpu_cores() // 2)} threads each)" in plan, plan
    kept = check_consistency(str(out), killed=True)  # OUT as the kill left it: its committed items, each right
    again = extract(corpus60, str(out), ray_settings(tiny_model_dir), shard_size=3)
    assert kept and again.skipped == len(kept) and again.ok == 61 - len(kept), (len(kept), again.skipped, again.ok)
    got = check_consistency(str(out), in_process.keys())  # nothing lost, nothing twice, no .tmp left
    assert all(np.array_equal(got[k], in_process[k]) for k in in_process)
