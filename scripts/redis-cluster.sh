#!/usr/bin/env bash
# A real local Redis Cluster for uswap's remote tier and its tests: 3 primaries + 3 replicas
# on loopback ports, no persistence, everything (config, logs, pid files) in one directory
# that `stop` removes.
#
#   scripts/redis-cluster.sh start  [--dir DIR] [--base-port P] [--node-timeout MS] [--password PW] [--tls]
#                                   [--owner PID]
#   scripts/redis-cluster.sh stop   [--dir DIR]
#   scripts/redis-cluster.sh status [--dir DIR]
#
# start: installs Debian's redis-server/redis-tools when missing (as root), picks 6 free ports
#   from P up (each port and its cluster-bus port P+10000 free), starts one redis-server per
#   port (127.0.0.1 only, protected mode, --save "" --appendonly no), joins them with
#   `redis-cli --cluster create ... --cluster-replicas 1`, waits until every node says
#   cluster_state:ok, then prints the nodes (127.0.0.1:PORT, one a line; also in DIR/nodes).
#   Any failure tears down what it started and exits non-zero. With --owner, a watcher stops
#   the cluster once process PID is gone (a test that aborts or is killed leaves no server).
# stop: kills exactly the servers whose pid files are in DIR (checking that each pid is still
#   a redis-server of that port) and removes DIR.
# status: one line per node (port, pid, alive, role, cluster state); exit 1 if any is down.
# --tls: TLS only (clients, replication, cluster bus), with a throw-away CA and a certificate
#   for 127.0.0.1 made with openssl in DIR/tls; clients trust DIR/tls/ca.crt (no client
#   certificates asked). The ports then speak rediss://.
#
# Defaults: DIR=${TMPDIR:-/tmp}/uswap-redis-cluster, P=21000, node timeout 2000 ms.
# Ports inside the kernel's ephemeral range (ip_local_port_range, where outgoing connections
# take their local ports) are skipped, for the client port and the bus port alike: a bind
# there can fail at any time.
# The cluster runs with cluster-require-full-coverage no: when a shard loses its primary
# and all its replicas, the other shards keep serving (the tests rely on it).
set -euo pipefail

NODES=6
MARKER=.uswap-redis-cluster

die() { echo "redis-cluster.sh: $*" >&2; exit 1; }
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}; [ -n "$cmd" ] || usage; shift
dir=${TMPDIR:-/tmp}/uswap-redis-cluster
base_port=21000
node_timeout=2000
password=
tls=0
owner=
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=${2:?--dir needs a value}; shift 2 ;;
    --base-port) base_port=${2:?--base-port needs a value}; shift 2 ;;
    --node-timeout) node_timeout=${2:?--node-timeout needs a value}; shift 2 ;;
    --password) password=${2:?--password needs a value}; shift 2 ;;
    --tls) tls=1; shift ;;
    --owner) owner=${2:?--owner needs a pid}; shift 2 ;;
    -h|--help) usage ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ $base_port =~ ^[0-9]+$ ]] && [ "$base_port" -ge 1024 ] && [ "$base_port" -le 55000 ] \
  || die "--base-port must be 1024..55000 (the cluster bus uses port+10000): $base_port"
[[ $node_timeout =~ ^[0-9]+$ ]] || die "--node-timeout must be milliseconds: $node_timeout"
[ -z "$owner" ] || [[ $owner =~ ^[0-9]+$ ]] || die "--owner must be a pid: $owner"

# redis-cli's connection options: TLS (read from DIR, so status/stop need no --tls)
tls_args() { [ -f "$dir/tls/ca.crt" ] && echo --tls --cacert "$dir/tls/ca.crt"; true; }

cli() { # cli PORT ARGS...: redis-cli against one node, with the password if there is one
  local port=$1; shift
  # shellcheck disable=SC2046
  if [ -n "$password" ]; then REDISCLI_AUTH=$password redis-cli $(tls_args) -h 127.0.0.1 -p "$port" "$@"
  else redis-cli $(tls_args) -h 127.0.0.1 -p "$port" "$@"; fi
}

make_certs() { # a CA and a server certificate for 127.0.0.1/localhost, in DIR/tls
  command -v openssl >/dev/null || die "--tls needs openssl"
  local t=$dir/tls
  mkdir -p "$t"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=uswap test CA" \
    -keyout "$t/ca.key" -out "$t/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$t/server.key" -out "$t/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$t/ext.cnf"
  openssl x509 -req -in "$t/server.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial \
    -days 2 -extfile "$t/ext.cnf" -out "$t/server.crt" 2>/dev/null
  chmod 600 "$t"/*.key
}

ensure_redis() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "redis-server/redis-cli missing; install them (apt-get install redis-server redis-tools) or run as root"
  echo "redis-cluster.sh: installing redis-server redis-tools" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq redis-server redis-tools >/dev/null
  command -v redis-server >/dev/null || die "redis-server still missing after apt-get install"
}

port_in_use() { # something accepts connections on 127.0.0.1:$1
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# pid of the redis-server on PORT started from DIR, if it still runs (a stale pid file or a
# reused pid gives nothing)
live_pid() {
  local port=$1 pidfile="$dir/redis-$1.pid" pid
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q "redis-server 127.0.0.1:$port\b" || return 1
  echo "$pid"
}

ports() { [ -f "$dir/ports" ] && cat "$dir/ports"; }

stop_cluster() {
  [ -d "$dir" ] || return 0
  [ -f "$dir/$MARKER" ] || die "$dir is not a cluster directory made by this script; not touching it"
  local port pid pids=()
  for pidfile in "$dir"/redis-*.pid; do
    [ -e "$pidfile" ] || continue
    port=${pidfile##*/redis-}; port=${port%.pid}
    if pid=$(live_pid "$port"); then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  # give them 3 s to exit, then SIGKILL the ones left
  for _ in $(seq 30); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf -- "$dir"
}

start_cluster() {
  ensure_redis
  if [ -e "$dir" ]; then
    [ -f "$dir/$MARKER" ] || die "$dir exists and is not a cluster directory made by this script"
    for port in $(ports); do live_pid "$port" >/dev/null && die "a cluster already runs in $dir (stop it first)"; done
    rm -rf -- "$dir"
  fi
  mkdir -p "$dir"
  touch "$dir/$MARKER"
  started=0
  trap '[ "$started" = 1 ] || { echo "redis-cluster.sh: start failed; tearing down" >&2; stop_cluster; }' EXIT
  trap 'exit 130' INT TERM

  # free ports: the client port and its cluster-bus port (+10000) both unused, both outside
  # the ephemeral range
  local chosen=() p=$base_port eph_lo=32768 eph_hi=60999
  read -r eph_lo eph_hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  ephemeral() { [ "$1" -ge "$eph_lo" ] && [ "$1" -le "$eph_hi" ]; }
  while [ ${#chosen[@]} -lt $NODES ]; do
    [ "$p" -le 55535 ] || { echo "no free ports from $base_port" >&2; false; }
    if ! ephemeral "$p" && ! ephemeral $((p + 10000)) && ! port_in_use "$p" && ! port_in_use $((p + 10000)); then
      chosen+=("$p")
    fi
    p=$((p + 1))
  done
  printf '%s\n' "${chosen[@]}" >"$dir/ports"

  local auth=() net=()
  [ -n "$password" ] && auth=(--requirepass "$password" --masterauth "$password")
  if [ $tls = 1 ]; then make_certs; fi
  for port in "${chosen[@]}"; do
    if [ $tls = 1 ]; then
      net=(--port 0 --tls-port "$port" --tls-cluster yes --tls-replication yes --tls-auth-clients no
        --tls-cert-file "$dir/tls/server.crt" --tls-key-file "$dir/tls/server.key" --tls-ca-cert-file "$dir/tls/ca.crt")
    else
      net=(--port "$port")
    fi
    redis-server "${net[@]}" --bind 127.0.0.1 --protected-mode yes \
      --daemonize yes --pidfile "$dir/redis-$port.pid" --logfile "$dir/redis-$port.log" \
      --dir "$dir" --dbfilename "dump-$port.rdb" --save "" --appendonly no --repl-diskless-load on-empty-db \
      --cluster-enabled yes --cluster-config-file "$dir/nodes-$port.conf" \
      --cluster-node-timeout "$node_timeout" --cluster-require-full-coverage no \
      "${auth[@]}"
  done

  # every node answers PING (10 s)
  for port in "${chosen[@]}"; do
    local ok=0
    for _ in $(seq 100); do
      [ "$(cli "$port" ping 2>/dev/null)" = PONG ] && { ok=1; break; }
      # a server that already exited (port taken, bad option) will not answer
      [ -f "$dir/redis-$port.log" ] && grep -q 'aborting\|FATAL' "$dir/redis-$port.log" && break
      sleep 0.1
    done
    [ $ok = 1 ] || { echo "node $port did not start; its log:" >&2; tail -5 "$dir/redis-$port.log" >&2 || true; false; }
  done

  local addrs=()
  for port in "${chosen[@]}"; do addrs+=("127.0.0.1:$port"); done
  # shellcheck disable=SC2046
  env ${password:+REDISCLI_AUTH="$password"} redis-cli $(tls_args) --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; false; }

  # every node: cluster_state:ok, all slots served, all nodes known; 3 replicas in sync (30 s)
  local deadline=$((SECONDS + 30)) settled=0
  while [ $SECONDS -lt $deadline ]; do
    settled=1
    for port in "${chosen[@]}"; do
      local info
      info=$(cli "$port" cluster info 2>/dev/null | tr -d '\r') || { settled=0; break; }
      grep -q '^cluster_state:ok$' <<<"$info" && grep -q '^cluster_slots_ok:16384$' <<<"$info" \
        && grep -q "^cluster_known_nodes:$NODES\$" <<<"$info" || { settled=0; break; }
    done
    if [ $settled = 1 ]; then
      local linked=0
      for port in "${chosen[@]}"; do
        cli "$port" info replication 2>/dev/null | tr -d '\r' | grep -q '^master_link_status:up$' && linked=$((linked + 1))
      done
      [ $linked = $((NODES / 2)) ] && break
      settled=0
    fi
    sleep 0.2
  done
  [ $settled = 1 ] || { echo "cluster did not settle in 30 s:" >&2; cli "${chosen[0]}" cluster nodes >&2 || true; false; }

  printf '%s\n' "${addrs[@]}" >"$dir/nodes"
  started=1
  if [ -n "$owner" ]; then
    # Detached, and holding none of the caller's pipes (it waits for our output's end).
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 1; done
                    [ -d "$2" ] && "$3" stop --dir "$2"' owner-watch "$owner" "$dir" "$0" \
      </dev/null >/dev/null 2>&1 &
  fi
  cat "$dir/nodes"
}

status_cluster() {
  [ -f "$dir/ports" ] || die "no cluster in $dir"
  local bad=0 pid role state
  for port in $(ports); do
    if pid=$(live_pid "$port"); then
      role=$(cli "$port" role 2>/dev/null | head -1 | tr -d '\r')
      state=$(cli "$port" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p')
      echo "127.0.0.1:$port pid $pid up ${role:-?} cluster_state:${state:-?}"
      [ "$state" = ok ] || bad=1
    else
      echo "127.0.0.1:$port down"; bad=1
    fi
  done
  return $bad
}

case "$cmd" in
  start) start_cluster ;;
  stop) stop_cluster ;;
  status) status_cluster ;;
  *) usage ;;
esac
