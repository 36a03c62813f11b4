#!/usr/bin/env bash
# expiremap-redis: its tests against a real redis-server, over TCP and TLS,
# and against Redis Clusters they start (installed here when missing, with
# redis-cli and openssl), its examples run against a server and a
# three-primary cluster this script starts on free loopback ports and stops
# (also on failure). Its benchmarks are type-checked by clippy.
. "$(dirname "$0")/lib.sh"

# redis-server (Debian's is built with TLS) and openssl (the TLS test makes
# a throwaway CA and server certificate with it).
missing=""
command -v redis-server >/dev/null || missing="$missing redis-server"
# redis-cli joins the test clusters (`--cluster create`); Debian ships it in
# redis-tools.
command -v redis-cli >/dev/null || missing="$missing redis-tools"
command -v openssl >/dev/null || missing="$missing openssl"
if [ -n "$missing" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  step "redis install" bash -c "$sudo apt-get update && $sudo apt-get install -y$missing"
  # The package may start a system server; ours start their own.
  $sudo service redis-server stop >/dev/null 2>&1 || true
fi

step redis cargo test -p expiremap-redis --release
# The features `metrics` and `tracing` (off by default): the series a
# named cache publishes, counted against a real server, and the spans
# and events a subscriber is handed.
step "redis features" cargo test -p expiremap-redis --release --features metrics,tracing --test integration -- metrics:: tracing::

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 20000))
}
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# Everything started below is stopped on exit, also on failure.
dir=$(mktemp -d)
pids=()
stop_servers() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap stop_servers EXIT

port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --notify-keyspace-events Ex --daemonize no --dir "$dir" >"$dir/log" 2>&1 &
pids+=($!)
wait_port "$port"
step "redis example near_cache" cargo run --release -p expiremap-redis --example near_cache -- "redis://127.0.0.1:$port"

# A three-primary cluster on free ports (each with a free bus port), for the
# cluster example.
nodes=()
for i in 1 2 3; do
  p=$(free_port); bus=$(free_port)
  mkdir -p "$dir/c$i"
  redis-server --port "$p" --cluster-port "$bus" --bind 127.0.0.1 --save '' --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --daemonize no \
    --dir "$dir/c$i" >"$dir/c$i/log" 2>&1 &
  pids+=($!)
  nodes+=("127.0.0.1:$p")
done
for n in "${nodes[@]}"; do wait_port "${n#*:}"; done
step "redis cluster create" redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes
for _ in $(seq 200); do
  ok=1
  for n in "${nodes[@]}"; do
    redis-cli -p "${n#*:}" CLUSTER INFO | grep -q cluster_state:ok || ok=0
  done
  [ "$ok" = 1 ] && break
  sleep 0.05
done
step "redis example near_cluster" cargo run --release -p expiremap-redis --example near_cluster -- \
  "redis://${nodes[0]}" "redis://${nodes[1]}"
