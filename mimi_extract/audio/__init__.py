"""Audio in: from a file's bytes to the encoder's 24 kHz input, by concern.

``decoders`` (which library decodes a file, and the decoders: libsndfile, FFmpeg), ``resample`` (the
streamed sinc resampler to 24 kHz), ``framing`` (the arithmetic of a ``--framing``: lengths, padding,
delay; torch-free), ``reader`` (an item read whole or chunk by chunk: :class:`~.reader.AudioReader`)
and ``device`` (the same resampling on the encoder's device).
"""
