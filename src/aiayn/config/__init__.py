"""Configuration: dataclasses, named presets, YAML files and dotted overrides.

One experiment = ``Config(model, data, train, decode)``. Every field has the paper's value
as its default where the paper gives one (Vaswani et al., 2017, "Attention Is All You Need",
arXiv:1706.03762); variants are options. Unknown keys and impossible values are
:class:`~aiayn.errors.ConfigError`s that name the field, e.g.
``model.n_heads: d_model=512 is not divisible by n_heads=7``.

- :mod:`aiayn.config.sections`: the four sections, their validation, the model presets.
- :mod:`aiayn.config.options`: the metadata of the decoding options (CLI flags, HTTP fields).
- :mod:`aiayn.config.coercion`: plain mappings to and from the dataclasses, type-checked.
- :mod:`aiayn.config.loading`: YAML files, ``model.preset`` and ``section.field=value`` overrides.
"""

from aiayn.config.coercion import from_dict, to_dict
from aiayn.config.loading import apply_overrides, config_from_dict, dump_config, load_config, save_config
from aiayn.config.options import DecodeOption, HttpField
from aiayn.config.sections import (
    DECAY_SCHEDULES,
    LENPEN_STYLES,
    LR_SCHEDULES,
    MODEL_PRESETS,
    TRAIN_LOGGERS,
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
    check_decode_bounds,
    decode_options,
    model_preset,
)

__all__ = [
    "DECAY_SCHEDULES",
    "LENPEN_STYLES",
    "LR_SCHEDULES",
    "MODEL_PRESETS",
    "TRAIN_LOGGERS",
    "Config",
    "DataConfig",
    "DecodeConfig",
    "DecodeOption",
    "HttpField",
    "ModelConfig",
    "TrainConfig",
    "apply_overrides",
    "check_decode_bounds",
    "config_from_dict",
    "decode_options",
    "dump_config",
    "from_dict",
    "load_config",
    "model_preset",
    "save_config",
    "to_dict",
]
