"""The federated engine: communication, client-held state, executors, the round, the loop and
evaluation."""
