"""Group mode: one member of a Kafka consumer group materializes the partitions the group assigns
it (Kafka Streams' KTable instances splitting a topic). :mod:`.member` is what the Materializer
delegates to (the membership, rebalances, what is served, kept partitions); beside it the
assignment handed over from the membership's thread (:mod:`.assignment`), the partitions kept
after the group moved them (:mod:`.kept`), what a member's marker tells readers (:mod:`.served`),
the producers' partitioner found from the data (:mod:`.partitioner`), key routing
(:mod:`.routing`), and the applied offsets committed to a group for lag tools (:mod:`.commit`,
``commit_group``: with or without a group of one's own).
"""
