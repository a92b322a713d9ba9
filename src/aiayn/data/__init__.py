"""Data: text files -> validated pairs -> token ids -> cached arrays -> batches.

Modules (import them directly; this package imports nothing heavy on its own):

- :mod:`.corpus`    read and validate parallel text (plain, gzip, TSV), training filters
- :mod:`.datasets`  known corpora (Multi30k, WMT14), mirrors, checksums, atomic downloads
- :mod:`.binarize`  memory-mapped id arrays keyed by a hash of their inputs
- :mod:`.batching`  token-budget batches, collation, deterministic shuffling, sharding, resume
- :mod:`.sampling`  subword regularization: training sentences segmented afresh each epoch
- :mod:`.synthetic` copy / reverse / sort / toy-language tasks from a seed
- :mod:`.prepare`   all of the above for `aiayn prepare`: the prepared-data directory
- :mod:`.trees`     constituency trees: read, clean, linearize, rebuild (parsing as translation)
- :mod:`.treebank`  the Penn Treebank as parsing data: splits, augmentation, prepared directory
"""
