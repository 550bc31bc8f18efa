#!/usr/bin/env bash
# CI phase 2: the differential compaction tests once more, through Testcontainers.
#
# No Docker engine is installed and no image registry is reachable, so:
#   * Debian's docker.io runs as root with no bridge and no iptables (containers use host
#     networking and the broker listens on 127.0.0.1 only), on a private socket;
#   * the image apache-kafka:<version> is built locally (.ci/kafka_image.sh: debootstrap + JRE +
#     the official jars), cached in the daemon's data root under ~/.cache/kafka-materializer/docker
#     (flock: one CI run at a time uses it);
#   * the daemon is stopped at the end, whatever happened.
# Usage: .ci/testcontainers.sh <python of the venv>
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${1:-.venv/bin/python}"
version="$("$python" -c 'from materializer.local.kafka_jars import KAFKA_VERSION; print(KAFKA_VERSION)')"
cache="${KAFKA_MATERIALIZER_CACHE:-$HOME/.cache/kafka-materializer}/docker"
mkdir -p "$cache"

if [ "$(id -u)" != 0 ]; then
  echo "testcontainers phase needs root (apt-get install docker.io, dockerd); running as $(id -un)" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  echo "== apt-get install docker.io debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null
fi

exec 9>"$cache/ci.lock"
flock 9
run="$(mktemp -d /run/kmat-ci.XXXXXX)"   # short: containerd's socket path must fit 108 bytes
export DOCKER_HOST="unix://$run/docker.sock"
dockerd --host="$DOCKER_HOST" --bridge=none --iptables=false --ip6tables=false \
  --data-root="$cache/data-root" --exec-root="$run/exec" --pidfile="$run/dockerd.pid" \
  >"$run/dockerd.log" 2>&1 &
dockerd_pid=$!
stop_daemon() {
  kill "$dockerd_pid" 2>/dev/null || true
  wait "$dockerd_pid" 2>/dev/null || true
  umount "$run"/exec/netns/* 2>/dev/null || true   # the host-network namespace handle
  rm -rf "$run" || true
}
trap stop_daemon EXIT
for _ in $(seq 1 60); do
  docker version >/dev/null 2>&1 && break
  if ! kill -0 "$dockerd_pid" 2>/dev/null; then
    echo "dockerd exited:" >&2; tail -20 "$run/dockerd.log" >&2; exit 1
  fi
  sleep 0.5
done
docker version --format 'docker engine {{.Server.Version}} on {{.Server.Os}}'

started=$(date +%s)
.ci/kafka_image.sh "$version" "$python"
echo "== image ready in $(( $(date +%s) - started )) s"

echo "== differential compaction tests through Testcontainers (apache-kafka:$version, host network, 127.0.0.1)"
"$python" -m pytest -p no:cacheprovider -q --kafka-broker=testcontainers \
  tests/integration/test_compaction_vs_broker.py tests/integration/test_cleaner_vs_broker_folder.py \
  tests/integration/test_broker_fixture.py -k "not more_keys_than_the_offset_map"
