#!/usr/bin/env bash
# expiremap-redis: its tests against a real redis-server, over TCP and TLS
# (installed here when missing, with openssl), its benchmark built, its
# example run against a server this script starts on a free loopback port
# and stops.
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
step "redis bench-build" cargo bench -p expiremap-redis --no-run

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
  || echo $((20000 + RANDOM % 20000)))
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --notify-keyspace-events Ex --daemonize no --dir "$dir" >"$dir/log" 2>&1 &
server=$!
stop_server() { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$dir"; }
trap stop_server EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.05
done
step "redis example near_cache" cargo run --release -p expiremap-redis --example near_cache -- "redis://127.0.0.1:$port"
