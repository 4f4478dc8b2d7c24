"""Reading an OUT back: the indexed reader and the lazy cuts (``reader``: ``mimi_extract.open``,
``read``, ``read_cuts``, ``megatron_blend``) and the training-side datasets (``dataset``)."""
