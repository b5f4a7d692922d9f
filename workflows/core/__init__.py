"""What several capabilities share: names, labels and IDs, bounds, telemetry, search attributes,
how a failure is explained and how a workflow waits. Imports no capability."""
