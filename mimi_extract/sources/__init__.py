"""Input sources: what to encode, as a list of :class:`Item`, whatever form the input takes.

Each kind of input is one module registered in :data:`REGISTRY` (``base.py`` has the interface):
a directory or a list of files (``files.py``), a lhotse manifest (``lhotse.py``), ...; every module of
this folder is imported here, so a new kind is its module alone (detected in the order of its
``Source.detect_order``), and, for the tests, its entry in ``tests/support/registered.py`` (how to
build an input of the kind; a registered kind with none fails the suite).  Every kind
yields :class:`Entry` rows -- a file or a member of a container, optionally a segment and a
channel, optionally an id -- and one shared :func:`probe` turns entries into items from headers
alone (no decoding), so a million-file corpus is planned up front.  Keys are unique by
construction: a duplicate becomes an error row, never a second dataset.  :func:`open_audio` is
how an engine gets an item's bytes, whatever its kind.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..audio.decoders import AudioError
from ..config.choices import KEY_MODES, SIDECAR_DURATION_MODES
from ..config.input_options import Options
from .base import REGISTRY, Source, loc_of, open_source, plan_group, probe, register
from .discover import discover, source_kind
from .files import AUDIO_EXTENSIONS, LIST_EXTENSIONS, read_list, walk_directory
from .items import Discovered, Entry, Item, Loc, SourceError, bytes_name
from .keys import dataset_name, dedup, segment_key
from .keys import ITEM_OPTIONS, item_identity  # the run's item identity: the options that shape items
from .probing import probe_info, seconds_to_samples
from .rows import segment_fields
from .text import printable, text_problem
from .lhotse import is_lhotse_manifest, read_lhotse_manifest


for _module in pkgutil.iter_modules(__path__):  # each kind's module registers it (Source.detect_order)
    importlib.import_module(f"{__name__}.{_module.name}")


def open_audio(item: Item):
    """What :class:`~mimi_extract.audio.reader.AudioReader` decodes for ``item``: a path or a file-like
    object with its bytes, opened by the item's kind (in the worker that encodes it).  Bytes that
    cannot be reached (a file deleted since planning, a damaged shard) raise AudioError: the
    item's error row, as a decode error is."""
    try:
        return open_source(item)
    except (SourceError, OSError) as e:
        raise AudioError(f"cannot read: {e}") from e


__all__ = ["AUDIO_EXTENSIONS", "KEY_MODES", "LIST_EXTENSIONS", "REGISTRY", "SIDECAR_DURATION_MODES", "Discovered", "Entry", "Item", "Options", "Source",
           "SourceError", "dataset_name", "dedup", "discover", "is_lhotse_manifest", "open_audio", "open_source", "plan_group",
           "printable", "probe", "probe_info", "read_lhotse_manifest", "read_list", "register", "seconds_to_samples",
           "segment_fields", "segment_key", "source_kind", "text_problem", "walk_directory"]
__all__ += ["ITEM_OPTIONS", "item_identity"]
__all__ += ["Loc", "bytes_name", "loc_of"]
