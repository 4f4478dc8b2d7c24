"""The names a run chooses among, in one torch-free place: the CLI offers them (``--help`` and a
usage error need no torch), and the modules that implement them (``audio``, ``settings``,
``sources``, ``engines``) import them from here, so an offered choice cannot drift from an
implemented one."""

SAMPLE_RATE = 24_000  # Mimi's input rate: every item is resampled to it
CHANNEL_MODES = ("mix", "first", "each")  # --channel: what a multichannel file becomes
FRAMINGS = ("transformers", "moshi", "moshi-stream", "muvap")  # --framing (see audio.Framing)
RESAMPLE_ON = ("auto", "host", "device")  # --resample-on: where to 24 kHz (auto: the device on a GPU)
RESAMPLERS = ("torchaudio", "causal")  # --resampler: causal = 16 kHz through the delayed filter (causal_16k)
DTYPES = ("fp32", "bf16", "fp16")  # --dtype: the compute precision (engines.device maps them to torch)
FEATURE_DTYPES = ("float32", "float16")  # --feature-dtype: how features are stored
ENGINES = ("local", "ray")  # --engine (engines.ENGINES implements each)
SIDECAR_DURATION_MODES = ("auto", "segment", "ignore")  # --sidecar-duration (sources.segment_fields)
KEY_MODES = ("path", "stem")  # --key: keys of items without an id
LIST_KEY_MODES = ("root", "written")  # --list-keys: a list row's key without an id (sources.files.read_list)
TOKEN_LAYOUTS = ("flat", "per-codebook")  # --token-layout: how codes become token ids (formats/megatron.py)
MAX_TOKEN_ID = 2**31 - 1  # int32: the widest token dtype megatron-core chooses

# --fidelity: what an ok row of a codes run says about how well its codes decode (codec/fidelity.py):
# manifest fields, Parquet columns, Megatron documents' and lhotse cuts' custom fields, by these names
FIDELITY_FIELDS = ("si_sdr", "mel_distance")
