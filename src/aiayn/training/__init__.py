"""Training: loss, learning-rate schedules, optimizer, the trainer, distributed set-up.

Checkpoint I/O lives one layer below, in :mod:`aiayn.checkpoint`, shared with inference.
"""
