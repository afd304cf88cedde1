"""The alfworld text-env family."""
