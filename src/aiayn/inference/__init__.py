"""Inference: search over a step function (greedy, beam, sampling) and text-to-text
translation with a trained checkpoint."""
