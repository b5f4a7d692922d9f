"""Request classes' side effects: ``RequestClassActivities`` (the gateway objects of each class)."""
