"""The codec: Mimi's encoder, exact under padding and chunking (``encoder``), getting and naming a
model (``model``, ``hub``), the private parts of transformers it relies on (``internals``), the
single-item reference every path is checked against (``reference``) and the offline demo's seeded
random model and corpus (``demo``)."""
