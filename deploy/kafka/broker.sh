#!/usr/bin/env bash
# Start and stop a single-node Apache Kafka (KRaft) broker on 127.0.0.1 from the jars that
# pom.xml fetches. `make kafka-up` / `make kafka-down` call this with the fixed ports; tests
# that restart a broker call it with their own folder and free ports, so they never disturb
# the shared one.
#
#   broker.sh start RUN_DIR [PLAINTEXT_PORT SASL_PORT CONTROLLER_PORT]   (defaults 19092 19093 19094)
#   broker.sh stop  RUN_DIR      # SIGTERM, wait, SIGKILL after KAFKA_STOP_TIMEOUT s; data kept
#   broker.sh clean RUN_DIR      # stop, then remove RUN_DIR
#   broker.sh jars               # fetch the jars if target/lib is missing
#
# start formats the storage on first use, starts the broker in the background (pid in
# RUN_DIR/broker.pid, output in RUN_DIR/broker.log) and waits until it serves; after
# KAFKA_START_TIMEOUT seconds (default 120) it fails, printing the log tail.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIB="$HERE/target/lib"
# One fixed cluster id: every broker here is a throw-away single node.
CLUSTER_ID="5WuQsYYPTgiC3rkBwghR6A"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"

die() { echo "broker.sh: $*" >&2; exit 1; }

jars() {
  ls "$LIB"/kafka_2.13-*.jar >/dev/null 2>&1 && return 0
  command -v mvn >/dev/null || die "mvn not found: install Maven (apt-get install maven) to fetch the Kafka jars"
  echo "fetching Apache Kafka jars from Maven Central into $LIB (once)"
  local start=$SECONDS
  # flock: two callers at once (make and a test) must not run Maven into the same folder.
  flock "$HERE/.mvn.lock" bash -c "ls '$LIB'/kafka_2.13-*.jar >/dev/null 2>&1 || mvn -q -B -f '$HERE/pom.xml' package" \
    || die "Maven could not fetch the Kafka jars (see the output above)"
  echo "kafka jars ready in $((SECONDS - start)) s"
}

# shellcheck disable=SC2206
JAVA=(java $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
  "-Dlog4j.configuration=file:$HERE/log4j.properties"
  "-Djava.security.auth.login.config=$HERE/kafka_server_jaas.conf"
  -cp "$LIB/*")

alive() { [ -f "$1/broker.pid" ] && kill -0 "$(cat "$1/broker.pid")" 2>/dev/null; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local run="$1" plain="${2:-19092}" sasl="${3:-19093}" ctrl="${4:-19094}"
  mkdir -p "$run"
  run="$(cd "$run" && pwd)"
  if alive "$run"; then echo "kafka already running (pid $(cat "$run/broker.pid"))"; return 0; fi
  jars
  # The base config with this broker's ports and folder appended (in a properties file the
  # last value of a key wins).
  {
    cat "$HERE/server.properties"
    echo
    echo "# --- appended by broker.sh"
    echo "controller.quorum.voters=1@127.0.0.1:$ctrl"
    echo "listeners=PLAINTEXT://127.0.0.1:$plain,SASL_PLAINTEXT://127.0.0.1:$sasl,CONTROLLER://127.0.0.1:$ctrl"
    echo "advertised.listeners=PLAINTEXT://127.0.0.1:$plain,SASL_PLAINTEXT://127.0.0.1:$sasl"
    echo "log.dirs=$run/data"
  } > "$run/server.properties"
  for p in "$plain" "$sasl" "$ctrl"; do
    port_open "$p" && die "port $p on 127.0.0.1 is already in use (another broker? make kafka-down)"
  done
  if [ ! -f "$run/data/meta.properties" ]; then
    "${JAVA[@]}" kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$run/server.properties" --ignore-formatted \
      > "$run/format.log" 2>&1 || { cat "$run/format.log" >&2; die "formatting the storage failed"; }
  fi
  local t0=$SECONDS mark=0
  touch "$run/broker.log"
  mark=$(wc -l < "$run/broker.log")
  # setsid: the broker outlives the make or test process that started it, in its own session.
  setsid "${JAVA[@]}" kafka.Kafka "$run/server.properties" >> "$run/broker.log" 2>&1 < /dev/null &
  echo $! > "$run/broker.pid"
  while true; do
    if ! alive "$run"; then
      tail -n 40 "$run/broker.log" >&2; rm -f "$run/broker.pid"
      die "the broker exited during start-up (log: $run/broker.log)"
    fi
    if tail -n +"$((mark + 1))" "$run/broker.log" | grep -q "Kafka Server started" && port_open "$plain" && port_open "$sasl"; then
      echo "kafka up on 127.0.0.1:$plain (SASL_PLAINTEXT :$sasl) in $((SECONDS - t0)) s, pid $(cat "$run/broker.pid")"
      return 0
    fi
    if [ $((SECONDS - t0)) -ge "$START_TIMEOUT" ]; then
      tail -n 40 "$run/broker.log" >&2
      stop "$run"
      die "the broker did not answer within $START_TIMEOUT s (log: $run/broker.log)"
    fi
    sleep 0.5
  done
}

stop() {
  local run="$1"
  [ -f "$run/broker.pid" ] || return 0
  local pid
  pid=$(cat "$run/broker.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
      if [ $((SECONDS - t0)) -ge "$STOP_TIMEOUT" ]; then
        echo "kafka (pid $pid) ignored SIGTERM for $STOP_TIMEOUT s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
      fi
      sleep 0.2
    done
  fi
  rm -f "$run/broker.pid"
}

case "${1:-}" in
  start) [ $# -ge 2 ] || die "usage: broker.sh start RUN_DIR [PLAINTEXT_PORT SASL_PORT CONTROLLER_PORT]"; start "${@:2}" ;;
  stop) [ $# -eq 2 ] || die "usage: broker.sh stop RUN_DIR"; stop "$2" ;;
  clean) [ $# -eq 2 ] || die "usage: broker.sh clean RUN_DIR"; stop "$2"; rm -rf "$2" ;;
  jars) jars ;;
  *) die "usage: broker.sh start|stop|clean RUN_DIR ... | jars" ;;
esac
