"""What a run writes: the run folder and its files (:mod:`.files`) and the checksums that tie a
record to the code and config that made it (:mod:`.checksums`)."""
