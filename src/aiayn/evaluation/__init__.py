"""Scoring: parsing F1 (EVALB conventions); BLEU beside it."""
