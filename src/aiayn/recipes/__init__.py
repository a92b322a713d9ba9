"""Recipes: whole runs wired from the building blocks below them (data, model, training,
inference, evaluation): ``train`` (``aiayn train``), ``demo`` (``aiayn demo``) and
``tune_decoding`` (``aiayn tune-decoding``)."""
