"""Local services for development and tests, from official jars on Maven Central: an Apache Kafka
broker (KRaft, :mod:`.kafka_broker` with its jars in :mod:`.kafka_jars`) and a Schema Registry
(Apicurio, :mod:`.schema_registry`), and what they share: the JVM service lifecycle
(:mod:`.jvm_service`), the Maven jar cache (:mod:`.maven_jars`) and free ports (:mod:`.ports`)."""
