"""Checkpoints on disk: save, load, verify, resolve, average (below training and inference).

- :mod:`.layout`          the names of a checkpoint's files and a run's pointers; format version
- :mod:`.weights`         model weights in safetensors: tied matrices once, strict loading
- :mod:`.training_state`  optimizer state and random-generator states, to resume training
- :mod:`.directory`       a checkpoint directory: atomic save, checksums, resolve, load
- :mod:`.manager`         a run's ``step_*`` checkpoints: ``last``/``best`` pointers, rotation
- :mod:`.average`         element-wise mean of several checkpoints (paper section 6.1)
"""
