"""Training one role: the role trainer and its micro-batch update loop (:mod:`.role_trainer`) and
the precision rules (:mod:`.precision`)."""
