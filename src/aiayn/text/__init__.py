"""Text <-> ids: SentencePiece tokenizers with fixed special ids (see :mod:`.tokenizer`)."""

from aiayn.text.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    train_tokenizer,
)

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer", "train_tokenizer"]
