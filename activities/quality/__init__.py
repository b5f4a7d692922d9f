"""The quality gates' side effects: the golden set asked of a version's Service, the mirrored
pairs read from their recorder, and golden sets stored in the registry beside the weights."""
