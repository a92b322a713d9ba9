"""Recipes: whole runs wired from the building blocks below them (data, model, training,
inference, evaluation): ``train`` (``aiayn train``) and ``demo`` (``aiayn demo``)."""
