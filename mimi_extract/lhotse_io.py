"""lhotse out, under its old name: the cuts of an OUT are built in ``formats/cuts.py`` (the formats
use them: Shar writes them into its shards); ``mimi_extract.read_cuts`` reads them."""

from .formats.cuts import CUTS, FIELDS, cut_dict, cut_dicts, register_lhotse_readers, write_cuts  # noqa: F401
