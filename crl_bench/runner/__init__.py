"""The entry points: the Python API (:mod:`.api`), the commands that train and evaluate."""
