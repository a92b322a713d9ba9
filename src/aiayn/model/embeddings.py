"""Token embeddings and positional encodings (paper section 3.4 and 3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.model.dropout import Dropout


def sinusoid_table(n_positions: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """The fixed encodings of section 3.5, shape (n_positions, d_model).

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same angle).
    ``interleaved`` puts them at dimensions 2i and 2i+1 as the formula does; ``concat``
    puts all sines in the first half and all cosines in the second (tensor2tensor,
    Marian, HF Marian): the same values up to a fixed permutation of dimensions.
    """
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, D/2)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    if layout == "interleaved":
        table[:, 0::2] = torch.sin(angle)
        table[:, 1::2] = torch.cos(angle)
    elif layout == "concat":
        half = d_model // 2
        table[:, :half] = torch.sin(angle)
        table[:, half:] = torch.cos(angle)
    else:
        raise ValueError(f"unknown sinusoid layout {layout!r}")
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds positions to (already scaled) embeddings, then applies dropout (section 5.4)."""

    table: Tensor  # the sinusoid buffer, registered only when kind == "sinusoidal"

    def __init__(self, d_model: int, max_positions: int, kind: str = "sinusoidal",
                 layout: str = "interleaved", dropout: float = 0.1) -> None:
        super().__init__()
        self.kind = kind
        self.max_positions = max_positions
        if kind == "sinusoidal":
            # A buffer, not a parameter, and not saved: it is a function of the config.
            self.register_buffer("table", sinusoid_table(max_positions, d_model, layout),
                                 persistent=False)
        elif kind == "learned":
            self.learned = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.learned.weight, mean=0.0, std=d_model**-0.5)
        else:
            raise ValueError(f"unknown positions {kind!r}")
        self.dropout = Dropout(dropout)

    def encodings(self, start: int, length: int) -> Tensor:
        """Positions start .. start+length-1, shape (length, d_model)."""
        if start + length > self.max_positions:
            raise ValueError(
                f"sequence of {start + length} positions exceeds max_positions={self.max_positions}"
            )
        if self.kind == "sinusoidal":
            return self.table[start:start + length]
        return self.learned.weight[start:start + length]

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        # x: (B, T, D)
        pe = self.encodings(start, x.size(1)).to(x.dtype)
        return self.dropout(x + pe)


class TokenEmbedding(nn.Module):
    """Embedding lookup multiplied by sqrt(d_model) (section 3.4)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.pad_id = pad_id
        self.scale = math.sqrt(d_model)
        # fairseq / tensor2tensor: N(0, d_model^-0.5), so that after the sqrt(d_model)
        # scale the embeddings have unit variance like the positions.
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.weight[pad_id].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        # tokens: (B, T) -> (B, T, D)
        return nn.functional.embedding(tokens, self.weight, self.pad_id) * self.scale
