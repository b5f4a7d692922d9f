"""One thin client per outside system, built from settings by the worker and passed to the activity classes."""
