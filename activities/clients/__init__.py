"""One thin client per outside system, built by the worker from its Settings and passed into the
activity classes (nothing here reads a setting or a global)."""
