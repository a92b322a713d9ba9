"""Checkpoints on disk: save, load, verify, resolve, average (below training and inference).

- :mod:`.io`       the checkpoint directory: safetensors weights, config, state, optimizer,
                   tokenizer, checksums; atomic saves; ``last``/``best`` pointers
- :mod:`.average`  element-wise mean of several checkpoints (paper section 6.1)
"""
