"""The replica fetcher's client settings: the consumer's librdkafka settings translated into
kafka-python's (:func:`replica_client_config`), and the fetch sizes' defaults."""

from __future__ import annotations

from ..kafka_source import KafkaSourceOptions

__all__ = ["DEFAULT_FETCH_MAX_BYTES", "DEFAULT_PARTITION_FETCH_MAX_BYTES", "DEFAULT_RECONNECT_BACKOFF_MAX_MS",
           "replica_client_config"]

#: Kafka consumer ``fetch.max.bytes`` default: the most one Fetch response may carry, bytes (50 MiB).
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
#: Bytes asked per partition (``max.partition.fetch.bytes``): 8 MiB here against the consumer's
#: 1 MiB, because the batches are appended whole and bigger responses cost fewer round trips.
DEFAULT_PARTITION_FETCH_MAX_BYTES = 8 * 1024 * 1024
#: Longest wait between two connection attempts to a broker that refused one, ms (the Java
#: client's ``reconnect.backoff.max.ms``; ``-X reconnect.backoff.max.ms=`` sets it).
DEFAULT_RECONNECT_BACKOFF_MAX_MS = 1_000

# librdkafka setting -> kafka-python argument.
_RENAMED = {
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
}
# Settings of the consumer that do not change how a Fetch request is sent or secured.
_CONSUMER_ONLY = ("group.", "enable.", "isolation.level", "auto.", "fetch.", "max.partition.fetch.bytes",
                  "statistics.", "session.timeout.ms", "heartbeat.", "max.poll.", "queued.", "debug",
                  "log_level", "log.", "socket.", "broker.", "topic.", "api.version", "client.rack",
                  "reconnect.", "retry.", "metadata.", "partition.assignment.", "check.crcs", "allow.")


def replica_client_config(options: KafkaSourceOptions, bootstrap_servers: str) -> dict[str, object]:
    """kafka-python client arguments equal to the consumer's librdkafka settings.

    ``options.client_config`` keys are librdkafka names (``security.protocol``, ``sasl.*``,
    ``ssl.*``, ``client.id``...); consumer-only keys (``group.id``, ``fetch.*``...) are left out
    (the fetch sizes are read by :class:`~materializer.adapters.replica_fetch.ReplicaFetcher` itself).

    Raises:
        ValueError: a ``sasl.*``/``ssl.*``/``security.*`` setting (or another unknown one) that
            kafka-python cannot honour: it is named, with ``--fetch consumer`` as the way out.
    """
    config: dict[str, object] = {
        "bootstrap_servers": bootstrap_servers.split(","),
        "client_id": "kafka-materializer-replica-fetch",
        "request_timeout_ms": options.request_timeout_ms,
        "receive_message_max_bytes": DEFAULT_FETCH_MAX_BYTES + 1024 * 1024,
        # kafka-python backs reconnects off up to 30 s: after a minute-long broker outage a run
        # stayed unready for 30-56 s once the broker was back. The Java client's bound, 1 s.
        "reconnect_backoff_max_ms": DEFAULT_RECONNECT_BACKOFF_MAX_MS,
    }
    for key, value in options.client_config.items():
        if key in _RENAMED:
            name = _RENAMED[key]
            config[name] = str(value).upper() if name in ("security_protocol", "sasl_mechanism") else value
        elif key == "ssl.endpoint.identification.algorithm":
            config["ssl_check_hostname"] = str(value).lower() == "https"
        elif key in ("request.timeout.ms",):
            config["request_timeout_ms"] = int(value)
        elif key in ("reconnect.backoff.ms", "reconnect.backoff.max.ms"):
            config[key.replace(".", "_")] = int(value)
        elif key.startswith(_CONSUMER_ONLY) and not key.startswith(("sasl.", "ssl.", "security.")):
            continue
        else:
            raise ValueError(f"client setting {key!r} has no equal in the replica fetch path (kafka-python); "
                             "use --fetch consumer (fetch='consumer') for this cluster")
    return config
