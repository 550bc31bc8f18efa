#!/bin/bash
# A script, not a test: how soon a `materializer run` is ready again after its broker was stopped
# for OUTAGE_S seconds (default 60) and started again, once per reconnect.backoff.max.ms given
# (default: kafka-python's 30000 against the replica path's 1000). One local broker (the project's
# `materializer broker`), one 3-partition topic of 3,000 records, one run with --metrics-port;
# prints seconds from the broker's restart to /health/ready answering 200.
#
#     bash benchmarks/bench_broker_return.sh            # from the repository, after `make venv`
#     OUTAGE_S=30 bash benchmarks/bench_broker_return.sh 30000 1000 10000
set -euo pipefail
cd "$(dirname "$0")/.."
P=.venv/bin/python; M="$P -m materializer"; OUTAGE_S=${OUTAGE_S:-60}
WORK=$(mktemp -d); S=$WORK/broker
trap '$M broker stop --state-dir $S >/dev/null 2>&1 || true; rm -rf $WORK' EXIT
B=$($M broker start --state-dir "$S" 2>/dev/null | tail -1)
echo "command: bash benchmarks/bench_broker_return.sh $*; nproc $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg); broker $B"
$P - "$B" <<'PY'
import sys
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap = sys.argv[1]
admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the future completes
admin.create_topics([NewTopic("rt", 3, 1)])["rt"].result(30)
producer = Producer({"bootstrap.servers": bootstrap})
for i in range(3000):
    producer.produce("rt", key=b"k%d" % i, value=b"v")
producer.flush(30)
PY
PORT=9790
for X in "${@:-30000 1000}"; do
  for BACKOFF in $X; do
    PORT=$((PORT + 1))
    $M run --bootstrap-servers "$B" --topic rt --data-dir "$WORK/d$BACKOFF" --no-progress --metrics-port $PORT \
      -X reconnect.backoff.max.ms=$BACKOFF > "$WORK/run$BACKOFF.log" 2>&1 &
    RUN=$!
    for _ in $(seq 120); do curl -sf localhost:$PORT/health/ready >/dev/null && break; sleep 0.5; done
    $M broker stop --state-dir "$S" >/dev/null 2>&1; sleep "$OUTAGE_S"
    $M broker start --state-dir "$S" >/dev/null 2>&1; T0=$(date +%s.%N)
    for _ in $(seq 1800); do curl -sf localhost:$PORT/health/ready >/dev/null && break; sleep 0.1; done
    echo "reconnect.backoff.max.ms=$BACKOFF: ready $(echo "$(date +%s.%N) - $T0" | bc) s after the broker started again (stopped ${OUTAGE_S} s)"
    kill $RUN; wait $RUN 2>/dev/null || true
  done
done
