"""The run: its parts (:mod:`.parts`), the context that builds them (:mod:`.context`) and the run
loop (:class:`.loop.RunLoop`); progress and evaluation logs."""
