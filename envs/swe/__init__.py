"""The swe text-env family."""
