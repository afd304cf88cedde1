"""The webshop text-env family."""
