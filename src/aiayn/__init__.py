"""aiayn: the Transformer of "Attention Is All You Need" as a practical NMT toolkit."""

__version__ = "0.1.0"
