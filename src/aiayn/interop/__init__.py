"""Moving models to and from the ecosystem: Hugging Face MarianMT and CTranslate2.

Needs the ``interop`` extra (``transformers``, ``ctranslate2``); importing this package
does not, the functions say what is missing when called.
"""

from aiayn.errors import InteropError
from aiayn.interop.hf_export import export_hf
from aiayn.interop.hf_import import import_hf, load_marian

__all__ = ["InteropError", "export_hf", "import_hf", "load_marian"]
