"""Task data for the SWE env (the `mini` task set)."""
