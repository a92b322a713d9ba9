"""aiayn: the Transformer of "Attention Is All You Need" as a practical NMT toolkit.

The Python API does what the ``aiayn`` commands do, step for step (docs/tutorial.md):

```python
import aiayn

aiayn.prepare("data-bin/mine", train_src="corpus/train.en", train_tgt="corpus/train.de",
              valid_src="corpus/valid.en", valid_tgt="corpus/valid.de")
aiayn.train("configs/multi30k_en_de.yaml", "runs/mine", overrides=["data.prepared_dir=data-bin/mine"])
aiayn.average("runs/mine", "runs/mine/averaged", last=5, force=True)
translator = aiayn.Translator.from_checkpoint("runs/mine/averaged")
hypotheses = translator.translate(["A man is riding a bike."])
aiayn.corpus_scores(hypotheses, ["Ein Mann fährt Fahrrad."])["bleu"]
```

Each name is imported on first use, so ``import aiayn`` loads neither torch nor the model,
and ``aiayn --help`` stays fast.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and the API reference see; __getattr__ imports at run time
    from aiayn.api import average, prepare, train
    from aiayn.checkpoint.directory import load_checkpoint
    from aiayn.config import Config, load_config
    from aiayn.errors import AiaynError
    from aiayn.evaluation.bleu import corpus_scores
    from aiayn.inference.parser import Parser
    from aiayn.inference.request import TranslationRequest
    from aiayn.inference.translator import Translator

# Exported name -> the module that defines it.
_EXPORTS = {
    "AiaynError": "aiayn.errors",
    "Config": "aiayn.config",
    "load_config": "aiayn.config",
    "prepare": "aiayn.api",
    "train": "aiayn.api",
    "average": "aiayn.api",
    "load_checkpoint": "aiayn.checkpoint.directory",
    "Translator": "aiayn.inference.translator",
    "TranslationRequest": "aiayn.inference.request",
    "Parser": "aiayn.inference.parser",
    "corpus_scores": "aiayn.evaluation.bleu",
}

__all__ = [
    "AiaynError",
    "Config",
    "Parser",
    "TranslationRequest",
    "Translator",
    "average",
    "corpus_scores",
    "load_checkpoint",
    "load_config",
    "prepare",
    "train",
]

__version__: str  # the installed distribution's, read on first access


def __getattr__(name: str) -> Any:
    """Import an exported name on first access (PEP 562)."""
    if name == "__version__":
        value: Any = _installed_version()
    elif name in _EXPORTS:
        value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
    globals()[name] = value  # later accesses skip this function
    return value


def _installed_version() -> str:
    # importlib.metadata parses the installed metadata: tens of milliseconds that
    # `aiayn --help` need not spend.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiayn")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})
