"""Packaged inputs, measured side by side in one run (not a test):

1. planning (discover: list + header probe) of N samples as loose files vs one uncompressed tar;
2. end to end (extract, tiny random model on CPU: the read path is then a large share of the work,
   the harshest case for it) on loose files vs tar shards vs Parquet of the same audio;
3. decode throughput per core (audio seconds per CPU second, one thread) for wav, flac, mp3, ogg
   opus, webm opus and m4a through the decoder the tool picks, decode alone and decode + 24 kHz;
4. ``decoders``: libsndfile against FFmpeg (PyAV) per codec, decode alone, and their samples compared.

    PYTHONPATH=. python scripts/bench_sources.py --plan-n 20000 --e2e-n 400 --out /tmp/bench-sources
"""

from __future__ import annotations

import host_facts  # scripts/host_facts.py: the host a run's figures belong to
import argparse
import json
import os
import shutil
import tarfile
import time

import numpy as np
import soundfile as sf
import torch


def corpus(root: str, n: int, seconds=(0.5, 1.5), rate: int = 16_000, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    names = []
    for i in range(n):
        name = f"s{i:06d}.flac"
        k = int(rate * rng.uniform(*seconds))
        t = np.arange(k) / rate
        x = 0.2 * np.sin(2 * np.pi * rng.uniform(100, 400) * t) + 0.02 * rng.standard_normal(k)
        sf.write(os.path.join(root, name), x.astype(np.float32), rate, subtype="PCM_16")
        names.append(name)
    return names


def to_tars(root: str, names: list[str], out: str, per_shard: int) -> str:
    os.makedirs(out, exist_ok=True)
    shards = 0
    for s in range(0, len(names), per_shard):
        with tarfile.open(os.path.join(out, f"shard-{s // per_shard:06d}.tar"), "w") as tf:
            for name in names[s: s + per_shard]:
                tf.add(os.path.join(root, name), arcname=name)
                data = json.dumps({"id": name}).encode()
                info = tarfile.TarInfo(name.split(".")[0] + ".json")
                info.size = len(data)
                import io

                tf.addfile(info, io.BytesIO(data))
        shards += 1
    return out


def to_parquet(root: str, names: list[str], out: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out, exist_ok=True)
    audio = pa.array([{"bytes": open(os.path.join(root, n), "rb").read(), "path": n} for n in names],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"audio": audio, "id": names}), os.path.join(out, "train-00000.parquet"),
                   row_group_size=100)  # the Hub's datasets write audio in 100-row groups
    return out


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (spawned encoder workers)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn):
    t0, c0 = time.perf_counter(), _cpu()
    result = fn()
    return result, time.perf_counter() - t0, _cpu() - c0


def plan(args):
    from mimi_extract.sources import Options, discover

    root = os.path.join(args.out, "plan-loose")
    names = corpus(root, args.plan_n, (0.2, 0.6))
    tars = to_tars(root, names, os.path.join(args.out, "plan-tar"), args.plan_n)
    rows = {}
    for label, src, opts in (("loose", root, None), ("tar", tars, Options(id_field="id")),
                             ("loose (again)", root, None), ("tar (again)", tars, Options(id_field="id"))):
        found, wall, cpu = timed(lambda: discover(src, options=opts))
        rows[label] = {"items": len(found.items), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
    rows["tar / loose (second runs, warm cache)"] = round(rows["tar (again)"]["wall_s"] / rows["loose (again)"]["wall_s"], 3)
    return rows


def e2e(args):
    from mimi_extract.config.request import RunRequest
    from mimi_extract.run.runner import run_request
    from mimi_extract.config.settings import Settings
    from mimi_extract.sources import Options
    from mimi_extract.codec.demo import random_model

    model_dir = os.path.join(args.out, "tiny-mimi")
    if not os.path.isdir(model_dir):
        random_model(seed=0).save_pretrained(model_dir)
    root = os.path.join(args.out, "e2e-loose")
    names = corpus(root, args.e2e_n, (1.0, 8.0), seed=1)
    tars = to_tars(root, names, os.path.join(args.out, "e2e-tar"), 100)
    pq = to_parquet(root, names, os.path.join(args.out, "e2e-parquet"))
    rows = {}
    for _rep in range(args.reps):
        for label, src, opts in (("loose", root, Options()), ("tar", tars, Options(id_field="id")),
                                 ("parquet", pq, Options(id_column="id"))):
            out = os.path.join(args.out, f"e2e-out-{label}")
            shutil.rmtree(out, ignore_errors=True)
            settings = Settings(model=model_dir, tap="codes", devices=("cpu",) * args.workers, num_workers=1)
            summary, wall, cpu = timed(lambda: run_request(RunRequest(src, out, settings, options=opts)))
            assert summary.ok == len(names), summary
            rows.setdefault(label, {"wall_s": [], "cpu_s": []})
            rows[label]["wall_s"].append(round(wall, 2))
            rows[label]["cpu_s"].append(round(cpu, 2))
            rows[label]["padding"] = round(summary.padding, 4)
            rows[label]["audio_s"] = round(summary.seconds, 1)
    # CPU seconds are what contention on a shared machine does not inflate; wall is shown too
    best = {k: (min(v["wall_s"]), min(v["cpu_s"])) for k, v in rows.items()}
    for label in ("tar", "parquet"):
        rows[f"speed {label} / loose"] = {"by_wall": round(best["loose"][0] / best[label][0], 3),
                                          "by_cpu": round(best["loose"][1] / best[label][1], 3)}
    return rows


def decode(args):
    import av

    from mimi_extract.audio.reader import AudioReader
    from mimi_extract.audio.decoders import decoder_for, open_decoder

    torch.set_num_threads(1)
    root = os.path.join(args.out, "decode")
    os.makedirs(root, exist_ok=True)
    rate, seconds = 48_000, args.decode_seconds
    rng = np.random.default_rng(0)
    t = np.arange(rate * seconds) / rate
    x = (0.2 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)
    x16 = x[:: 3]  # 16 kHz copy for the speech-rate rows
    files = {}
    for name, data, r, kw in (("wav16k.wav", x16, 16_000, {"subtype": "PCM_16"}),
                              ("flac16k.flac", x16, 16_000, {"subtype": "PCM_16"}),
                              ("flac48k.flac", x, rate, {"subtype": "PCM_16"}),
                              ("mp3_48k.mp3", x, rate, {}),
                              ("opus48k.opus", x, rate, {"format": "OGG", "subtype": "OPUS"})):
        path = os.path.join(root, name)
        sf.write(path, data, r, **kw)
        files[name] = path
    for name, container, codec in (("m4a_48k.m4a", "mp4", "aac"), ("opus48k.webm", "webm", "libopus")):
        path = os.path.join(root, name)
        with av.open(path, "w", format=container) as out:
            stream = out.add_stream(codec, rate=rate, layout="mono")
            for i in range(0, len(x), 960):
                frame = av.AudioFrame.from_ndarray(x[None, i: i + 960], format="fltp", layout="mono")
                frame.sample_rate = rate
                for p in stream.encode(frame):
                    out.mux(p)
            for p in stream.encode(None):
                out.mux(p)
        files[name] = path
    rows, frames = {}, {}
    for name, path in files.items():
        def dec():
            f = open_decoder(path)
            n = 0
            while True:
                block = f.read(1 << 16, dtype="float32", always_2d=True)
                if not len(block):
                    break
                n += len(block)
            rate = f.samplerate
            f.close()
            frames[name] = n
            return n / rate

        def dec_resample():  # as an engine reads an item: its length known from the plan
            r = AudioReader(path, frames=frames[name])
            try:
                return len(r.read_all()) / 24_000
            finally:
                r.close()

        audio_s, _, cpu = timed(dec)
        _, _, cpu24 = timed(dec_resample)
        rows[name] = {"decoder": decoder_for(path), "audio_s": round(audio_s, 1),
                      "decode_x_per_core": round(audio_s / cpu, 1),
                      "decode_plus_24k_x_per_core": round(audio_s / cpu24, 1)}
    return rows


def _speech(n: int, rate: int, seed: int) -> np.ndarray:
    """bench_ceilings' speech-like signal (an envelope over harmonics and a little noise)."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_ceilings import speechlike

    return speechlike(n, rate, np.random.default_rng(seed))


def _pyav_write(path: str, x: np.ndarray, rate: int, container: str, codec: str) -> None:
    import av

    with av.open(path, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        size = stream.codec_context.frame_size or 1024
        for i in range(0, len(x), size):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[None, i: i + size]), format="fltp", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def decoders(args):
    """libsndfile against FFmpeg (PyAV) per codec, decode alone, one thread, CPU time (best of
    --reps): libsndfile's float32 and int16 reads (blocks of 65,536 frames, as AudioReader reads),
    FFmpeg's frames as PyAV returns them (``raw``: the decoder's own speed), and PyAVFile, the
    tool's PyAV reader (what a run would pay); the samples compared with libsndfile's decode
    (length, max |difference|).  Speech-like mono, --decode-seconds long.  Ogg Opus twice: stated
    48 kHz and 16 kHz (libsndfile decodes at the stated rate, FFmpeg always at 48 kHz).  FLAC also
    through the faster decoders that were candidates (issue 40): dr_flac (the ``miniaudio``
    package) and ``pedalboard`` (JUCE's libFLAC), where installed, with what each makes of a FLAC
    cut in half and of one with 1,000 zeroed bytes (``damaged``): libsndfile refuses both.  And the
    tool's own FLAC path since 0.4, ``dr_flac (DrFlacFile)``: dr_flac as a whole-file read opens it
    (``open_decoder(..., span=(0, None))``), in the same blocks, float32 and int16, with its count
    check; side by side with libsndfile in the same run."""
    import av

    from mimi_extract.audio.decoders import PyAVFile

    torch.set_num_threads(1)
    root = os.path.join(args.out, "decoders")
    os.makedirs(root, exist_ok=True)
    seconds = args.decode_seconds
    files = {}
    for name, rate, kw in (("flac16k.flac", 16_000, {"subtype": "PCM_16"}), ("flac48k.flac", 48_000, {"subtype": "PCM_16"}),
                           ("mp3_48k.mp3", 48_000, {"format": "MP3", "subtype": "MPEG_LAYER_III"}),
                           ("opus48k.opus", 48_000, {"format": "OGG", "subtype": "OPUS"}),
                           ("opus16k.opus", 16_000, {"format": "OGG", "subtype": "OPUS"}),
                           ("vorbis48k.ogg", 48_000, {"format": "OGG", "subtype": "VORBIS"})):
        path = os.path.join(root, name)
        if not os.path.exists(path):
            x = _speech(rate * seconds, rate, len(files))
            with sf.SoundFile(path, "w", rate, 1, **kw) as f:  # in 1 s writes: one large Vorbis write came out empty
                for i in range(0, len(x), rate):
                    f.write(x[i: i + rate])
        files[name] = (path, rate)
    path = os.path.join(root, "aac48k.m4a")
    if not os.path.exists(path):
        _pyav_write(path, _speech(48_000 * seconds, 48_000, 9), 48_000, "mp4", "aac")
    files["aac48k.m4a"] = (path, 48_000)

    def best(fn):
        out, spent = None, []
        for _ in range(args.reps):
            t = time.process_time()
            out = fn()
            spent.append(time.process_time() - t)
        return out, min(spent)

    def soundfile_read(path, dtype):
        with sf.SoundFile(path) as f:
            parts = []
            while len(block := f.read(1 << 16, dtype=dtype, always_2d=True)):
                parts.append(block)
        data = np.concatenate(parts)[:, 0]
        return data.astype(np.float32) / 32768 if dtype == "int16" else data

    def pyav_raw(path):
        with av.open(path) as c:
            parts = [frame.to_ndarray() for frame in c.decode(audio=0)]
        data = np.concatenate(parts, axis=-1)[0]
        return data.astype(np.float32) / 32768 if data.dtype == np.int16 else data.astype(np.float32)

    def dr_flac(path):  # miniaudio's dr_flac, whole file at once (its streaming API is a Python generator)
        import miniaudio

        d = miniaudio.flac_read_file_s16(path)
        return np.frombuffer(d.samples, np.int16).reshape(-1, d.nchannels)[:, 0].astype(np.float32) / 32768

    def pedalboard_raw(path):  # JUCE's libFLAC: int16 as in the file, in the tool's blocks
        import pedalboard.io

        with pedalboard.io.AudioFile(path) as f:
            parts = []
            while (block := f.read_raw(1 << 16)).shape[1]:
                parts.append(block[0])
        return np.concatenate(parts).astype(np.float32) / 32768

    def damaged(read, path):
        """What ``read`` makes of ``path`` cut in half, and with 1,000 bytes zeroed in the middle."""
        data, said = open(path, "rb").read(), {}
        for label, blob in (("cut in half", data[: len(data) // 2]),
                            ("1,000 bytes zeroed", data[: len(data) // 2] + bytes(1000) + data[len(data) // 2 + 1000:])):
            bad = os.path.join(root, "damaged.flac")
            open(bad, "wb").write(blob)
            try:
                said[label] = f"{len(read(bad))} samples, no error"
            except Exception as e:  # noqa: BLE001 -- what each library raises is the finding
                said[label] = f"error: {str(e)[:80]}"
        return said

    def tool_flac(path, dtype):  # the tool's reader of a FLAC file read whole (dr_flac since 0.4)
        from mimi_extract.audio.decoders import DrFlacFile, open_decoder

        f = open_decoder(path, span=(0, None))
        assert isinstance(f, DrFlacFile), type(f)
        parts = []
        while len(block := f.read(1 << 16, dtype=dtype)):
            parts.append(block)
        f.close()
        data = np.concatenate(parts)[:, 0]
        return data.astype(np.float32) / 32768 if dtype == "int16" else data

    def pyav_file(path):
        f = PyAVFile(path)
        parts = []
        while len(block := f.read(1 << 16)):
            parts.append(block)
        f.close()
        return np.concatenate(parts)[:, 0]

    rows = {}
    for name, (path, _rate) in files.items():
        if args.decoder_files and name not in args.decoder_files:
            continue
        row, ref = {"seconds": seconds}, None
        readers = [("pyav raw", pyav_raw), ("pyav (PyAVFile)", pyav_file)]
        if not name.endswith(".m4a"):
            readers = [("soundfile float32", lambda p: soundfile_read(p, "float32"))] + readers
            if name.startswith("flac"):
                readers.insert(1, ("soundfile int16", lambda p: soundfile_read(p, "int16")))
                readers[2:2] = [("dr_flac (DrFlacFile) float32", lambda p: tool_flac(p, "float32")),
                                ("dr_flac (DrFlacFile) int16", lambda p: tool_flac(p, "int16"))]
                for label, module, fn in (("dr_flac (miniaudio)", "miniaudio", dr_flac),
                                          ("pedalboard read_raw", "pedalboard", pedalboard_raw)):
                    try:
                        __import__(module)
                    except ImportError:
                        continue
                    readers.append((label, fn))
        for label, read in readers:
            data, cpu = best(lambda: read(path))
            r = {"x_per_core": round(seconds / cpu, 1), "frames": len(data)}
            if ref is None:
                ref = data
            elif len(data) == len(ref):  # (Opus stated at 16 kHz: libsndfile's 16 kHz against FFmpeg's 48)
                r["max_abs_diff_vs_first"] = float(np.abs(data - ref).max())
            if name == "flac16k.flac" and label != "pyav raw":
                r["damaged"] = damaged(read, path)
            row[label] = r
        rows[name] = row
        print(name, {k: v["x_per_core"] for k, v in row.items() if isinstance(v, dict)}, flush=True)
    return rows


def padding(args):
    """Padding share of the plan (padded - real samples over padded, short items' batches) of the
    same corpus as an uncompressed tar (one global sort) and as a .tar.gz sorted within groups of
    --sort-buffer-mb, at the CPU and the GPU step defaults."""
    import gzip

    from mimi_extract.engines.plan import padding_fraction, plan_units
    from mimi_extract.sources import Options, discover, plan_group

    root = os.path.join(args.out, "pad-loose")
    names = corpus(root, args.pad_n, (1.0, 15.0), seed=2)
    tars = to_tars(root, names, os.path.join(args.out, "pad-tar"), len(names))
    tgz = os.path.join(args.out, "pad-tgz")
    os.makedirs(tgz, exist_ok=True)
    with open(os.path.join(tars, "shard-000000.tar"), "rb") as f, gzip.open(os.path.join(tgz, "shard.tar.gz"), "wb") as g:
        shutil.copyfileobj(f, g)
    size_mb = os.path.getsize(os.path.join(tars, "shard-000000.tar")) / 2**20
    rows = {"corpus": {"samples": len(names), "tar_MiB": round(size_mb, 1)}}
    for label, src, opts in [("tar (global sort)", tars, Options(id_field="id"))] + [
            (f"tgz, --sort-buffer-mb {mb}", tgz, Options(id_field="id", sort_buffer_mb=mb)) for mb in args.buffers]:
        items = discover(src, options=opts).items
        groups = {}
        for it in items:
            groups.setdefault(plan_group(it), []).append(it)
        row = {"groups": len(groups)}
        for where, step, batch, chunk in (("cpu", 4.0, 8, 4 * 24_000), ("gpu", 300.0, 64, 30 * 24_000)):
            units = [u for g in sorted(groups) for u in plan_units(groups[g], chunk, step, batch)]
            row[f"padding_{where}"] = round(padding_fraction([u.items for u in units if not u.stream]), 4)
        rows[label] = row
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/bench-sources")
    p.add_argument("--plan-n", type=int, default=20_000)
    p.add_argument("--e2e-n", type=int, default=400)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--decode-seconds", type=int, default=120)
    p.add_argument("--pad-n", type=int, default=600)
    p.add_argument("--decoder-files", nargs="+", help="decoders: only these files (e.g. flac16k.flac flac48k.flac)")
    p.add_argument("--buffers", type=float, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--only", choices=("plan", "e2e", "decode", "decoders", "padding"), action="append")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    result = {}
    for part, fn in (("decode", decode), ("decoders", decoders), ("plan", plan), ("padding", padding), ("e2e", e2e)):
        if not args.only or part in args.only:
            result[part] = fn(args)
            print(json.dumps({part: result[part]}, indent=1), flush=True)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({**result, "host": host_facts.report()}, f, indent=1)


if __name__ == "__main__":
    print(host_facts.header(), flush=True)
    main()
    print(host_facts.footer(), flush=True)
