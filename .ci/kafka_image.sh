#!/usr/bin/env bash
# Build the local Docker image `apache-kafka:<version>` without any image registry:
#   1. a minimal Debian root file system (debootstrap, packages from deb.debian.org) with a
#      headless JRE (openjdk-17-jre-headless), cached as a tarball;
#   2. the official Apache Kafka jars of <version> (Maven Central, resolved by
#      materializer.local.kafka_jars into ~/.cache/kafka-materializer/kafka-<version>/lib);
#   3. `docker import` of the root file system as kafka-materializer/debian-jre17:bookworm, then
#      `docker cp` of the jars and an entrypoint (formats KRaft storage, runs kafka.Kafka with the
#      properties given as KAFKA_PROP_<key with "." as "__"> env vars) and `docker commit`.
# Both images stay in the daemon's data root (the CI keeps it under the cache); a present
# apache-kafka:<version> is reused as it is.
#
# Usage: .ci/kafka_image.sh <version> <python-with-materializer>
# Needs root, debootstrap, a running dockerd (DOCKER_HOST) and the docker CLI.
set -euo pipefail
version="${1:?kafka version}"
python="${2:?python with the materializer package}"
cache="${KAFKA_MATERIALIZER_CACHE:-$HOME/.cache/kafka-materializer}"
image="apache-kafka:${version}"
rootfs_tar="$cache/docker/debian-bookworm-jre17-rootfs.tar"
mkdir -p "$cache/docker"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "image $image already present"
  exit 0
fi

if [ ! -s "$rootfs_tar" ]; then
  work="$(mktemp -d "$cache/docker/rootfs.XXXXXX")"
  echo "== debootstrap bookworm + openjdk-17-jre-headless into $work (once)"
  debootstrap --variant=minbase --include=openjdk-17-jre-headless,ca-certificates-java \
    bookworm "$work/root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { tail -30 "$work/debootstrap.log"; exit 1; }
  chroot "$work/root" apt-get clean
  rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/usr/share/doc" "$work/root/usr/share/man"
  tar -C "$work/root" -cf "$rootfs_tar.tmp" .
  mv "$rootfs_tar.tmp" "$rootfs_tar"
  rm -rf "$work"
fi

lib="$("$python" -c "from materializer.local.kafka_jars import ensure_kafka_jars; print(ensure_kafka_jars('$version'))")"
build="$(mktemp -d "$cache/docker/build.XXXXXX")"
trap 'rm -rf "$build"' EXIT
mkdir -p "$build/opt/kafka/libs"
cp "$lib"/*.jar "$build/opt/kafka/libs/"
cat >"$build/opt/kafka/run.sh" <<'EOF'
#!/bin/sh
# Entrypoint of apache-kafka:<version>: KAFKA_PROP_<name> env vars become server.properties lines
# (name with "__" for "."), storage is formatted once, then kafka.Kafka runs in the foreground.
set -e
mkdir -p /opt/kafka/config /var/lib/kafka/data
env | sed -n 's/^KAFKA_PROP_\([^=]*\)=\(.*\)$/\1=\2/p' | sed 's/__/./g' >/opt/kafka/config/server.properties
cat >/opt/kafka/config/log4j2.xml <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN"><Appenders><Console name="out" target="SYSTEM_OUT"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders>
<Loggers><Root level="INFO"><AppenderRef ref="out"/></Root></Loggers></Configuration>
XML
CP="/opt/kafka/libs/*"
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  java -Xmx256m -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.xml -cp "$CP" \
    kafka.tools.StorageTool format --ignore-formatted -t "${KAFKA_CLUSTER_ID:-MkU3OEVBNTcwNTJENDM2Qk}" \
    -c /opt/kafka/config/server.properties
fi
exec java ${KAFKA_JVM_OPTS:--Xms256m -Xmx1g -XX:+UseG1GC} -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.xml \
  -cp "$CP" kafka.Kafka /opt/kafka/config/server.properties
EOF
chmod +x "$build/opt/kafka/run.sh"
base="kafka-materializer/debian-jre17:bookworm"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  echo "== docker import $base from $rootfs_tar"
  docker import "$rootfs_tar" "$base" >/dev/null
fi
echo "== $image = $base + $(ls "$build/opt/kafka/libs" | wc -l) jars of Kafka $version"
cid="$(docker create "$base" /bin/true)"
docker cp "$build/opt" "$cid:/" >/dev/null
docker commit --change 'ENTRYPOINT ["/opt/kafka/run.sh"]' --change 'CMD []' \
  --change "LABEL org.apache.kafka.version=$version" "$cid" "$image" >/dev/null
docker rm "$cid" >/dev/null
echo "built $image"
