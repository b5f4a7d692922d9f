"""Quality gates: a version that answers wrongly is caught, not only one that errs or is slow."""
