"""The real-shapes table of docs/inputs.md: every shape of tests/support/shapes.py generated, probed and
read by the tool, and compared with FFmpeg's whole decode (PyAV's plain loop; of a file with tags
appended, its audio alone: ``Shape.audio``).

    python scripts/real_shapes.py [--before CHECKOUT] [--folder DIR]

``--before``: a checkout of an older commit (``git worktree add --detach /tmp/before <commit>``), whose
probe of the same files fills a "before" column (run in its own interpreter, that checkout first on
the path).  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402

from support.shapes import ffmpeg_decode, reference_file, shapes  # noqa: E402

PROBE = """
import json, sys
from mimi_extract.sources import discover
found = discover(sys.argv[1])
rows = {i.key: {"ok": True, "frames": i.frames} for i in found.items}
rows.update({b.key: {"ok": False, "error": b.error} for b in found.bad})
print(json.dumps(rows))
"""


def probe_with(checkout: str, folder: Path) -> dict:
    """What the tool at ``checkout`` finds in ``folder`` (its own interpreter: nothing shared)."""
    env = {**os.environ, "PYTHONPATH": checkout}
    run = subprocess.run([sys.executable, "-c", PROBE, str(folder)], env=env, capture_output=True, text=True,
                         cwd=checkout, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def status(row: dict | None, ref_frames: int | None) -> str:
    if row is None:
        return "missing"
    if not row["ok"]:
        reason = row["error"].replace("unreadable or corrupt audio header: ", "").replace("|", "/")
        return f"error: {reason[:70]}{'…' if len(reason) > 70 else ''}"
    if ref_frames is not None and row["frames"] != ref_frames:
        return f"ok, {row['frames']} samples (FFmpeg: {ref_frames})"
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a checkout of an older commit, for a 'before' column")
    parser.add_argument("--folder", help="where to write the corpus (default: a temporary folder)")
    args = parser.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="shapes-"))
    folder.mkdir(parents=True, exist_ok=True)
    for shape in shapes():
        shape.make(folder / shape.filename)

    from mimi_extract.audio.decoders import seek_exact, open_decoder

    after = probe_with(ROOT, folder)
    before = probe_with(os.path.abspath(args.before), folder) if args.before else None
    head = "| shape | bytes | FFmpeg samples |" + (" before |" if before else "") + " now | max \\|Δ\\| whole / segment |"
    print(head)
    print("|" + "---|" * head.count(" |"))
    references = Path(tempfile.mkdtemp(prefix="shape-references-"))  # (not in the corpus: no input)
    for shape in shapes():
        path = folder / shape.filename
        try:
            ref = ffmpeg_decode(reference_file(shape, path, references))
        except Exception as e:  # FFmpeg fails too
            ref, ff = None, f"fails ({type(e).__name__})"
        else:
            ff = str(len(ref))
        diff = ""
        if ref is not None and after.get(shape.filename, {}).get("ok"):
            f = open_decoder(str(path))
            whole = f.read(len(ref) + 1, dtype="float32", always_2d=True)
            f.close()
            f = open_decoder(str(path))
            seek_exact(f, len(ref) // 3)
            seg = f.read(20_000, dtype="float32", always_2d=True)
            f.close()
            want = ref[len(ref) // 3: len(ref) // 3 + 20_000]
            d1 = np.abs(whole - ref).max() if whole.shape == ref.shape else float("nan")
            d2 = np.abs(seg - want).max() if seg.shape == want.shape else float("nan")
            diff = f"{d1:.1e} / {d2:.1e}" if d1 or d2 else "0 / 0"
        frames = len(ref) if ref is not None else None
        cells = [shape.name, str(path.stat().st_size), ff]
        if before is not None:
            cells.append(status(before.get(shape.filename), frames))
        cells += [status(after.get(shape.filename), frames), diff]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
