"""The output store: one run directory, format-agnostic.

A *run directory* (OUT itself, or ``OUT/part-I-of-N`` for one part of a job array) holds:

* ``lock`` -- an exclusive ``flock`` held for the whole run (the OS drops it when the process
  dies, so kill -9 leaves no stale lock); its text names the holder (pid, host, start, command);
* ``run.json`` -- settings and provenance: model, content hash of its weights, input root, tap,
  framing, output format...; a resume with anything else is refused;
* shards (their layout is the format's: ``formats/hdf5.py``, ``formats/parquet.py``...) and
  ``manifest.jsonl`` -- one row per input: ok rows name their shard, error rows say why.

Modules, bottom up: ``files`` (names, errors, durable writes), ``lock``, ``manifest`` (rows, run
directories, shard names), ``read`` (items back, checksum scan), ``identity`` (``run.json``),
``recover`` (resume: temporaries, uncommitted rows, quarantine), ``writer`` (the commit protocol,
:class:`~mimi_extract.store.writer.ShardWriter`), ``shar_extend`` (``--shar-extend``'s writer) and
``directory`` (:class:`~mimi_extract.store.directory.RunDirectory`: what a run does with its
directory, from lock to finish).
"""
