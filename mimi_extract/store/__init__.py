"""The output store: one run directory, format-agnostic.

A *run directory* (OUT itself, or ``OUT/part-I-of-N`` for one part of a job array) holds:

* ``lock`` -- an exclusive ``flock`` held for the whole run (the OS drops it when the process
  dies, so kill -9 leaves no stale lock); its text names the holder (pid, host, start, command);
* ``run.json`` -- settings and provenance: model, content hash of its weights, input root, tap,
  framing, output format...; a resume with anything else is refused;
* shards (their layout is the format's: ``formats/hdf5.py``, ``formats/parquet.py``...) and
  ``manifest.jsonl`` -- one row per input: ok rows name their shard, error rows say why.

Modules, bottom up: ``files`` (names, errors, durable writes: the one byte writer), ``lock`` (and
its holder), ``manifest`` (rows, run directories, shard names), ``plan_info`` (``plan.json``),
``read`` (items back, checksum scan), ``identity`` (``run.json``: read, write, compare), ``cuts``
(``cuts.jsonl.gz``), ``mirror`` (an OUT on object storage), ``recover`` (resume: temporaries,
uncommitted rows, quarantine), ``writer`` (the commit protocol,
:class:`~mimi_extract.store.writer.ShardWriter`), ``shar_extend`` (``--shar-extend``'s writer),
``run_info`` (what a run records of itself, from its request, input and model) and ``directory``
(:class:`~mimi_extract.store.directory.RunDirectory`: the runner's one door, from the checks before
the lock to finish).
"""
