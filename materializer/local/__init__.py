"""Local services for development and tests, from official jars on Maven Central: an Apache Kafka
broker (KRaft) and a Schema Registry (Apicurio), and the jar cache they share."""
