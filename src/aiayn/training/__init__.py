"""Training: loss, learning-rate schedules, optimizer, checkpoints, the trainer.

Submodules are imported on demand (``aiayn.training.checkpoint`` is what inference and
interop code needs; it does not pull in the trainer).
"""
