"""The minihack text-env family."""
