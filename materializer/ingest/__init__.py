"""How records reach the local logs: the replica fetch path (the leader's batches, appended
verbatim as a follower appends them) and the consumer path (records through confluent-kafka)."""
