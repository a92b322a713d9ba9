"""The special ids and pieces of every vocabulary aiayn trains, loads or exports.

Fixed so that data, model, search and interop agree without passing a tokenizer around:
PAD = 0 (ignored by the loss and the attention masks), UNK = 1, BOS = 2 (the decoder's
first input), EOS = 3 (ends every source and every target).
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
# Dropped when ids are decoded to text; UNK is kept (SentencePiece decodes it to ⁇).
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))
EOS_PIECE = EOS
