"""What a run is: the configuration schema and presets (:mod:`.schema`), their validation
(:mod:`.validation`) and the errors a bad setting raises (:mod:`.errors`). The lowest of the run's
packages: records, training, the run loop and the entry points all read it; it reads none of them."""
