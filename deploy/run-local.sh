#!/usr/bin/env bash
# Runs Cairn on this machine: the local Kafka broker (left running afterwards), the topics, and
# the service with the demo agent in the foreground. Ctrl-C stops the service; `make kafka-down`
# stops the broker. Settings come from CAIRN_ variables; the defaults below suit a first try.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${CAIRN_PYTHON:-.venv/bin/python}
if [[ ! -x "$PY" ]]; then
	echo "run: $PY not found; run \`make install\` first (or set CAIRN_PYTHON)" >&2
	exit 1
fi

# shellcheck disable=SC2086 # KAFKA_ARGS holds several options on purpose
up=$("$PY" deploy/local-kafka/kafka_local.py up ${KAFKA_ARGS:-})
echo "$up"
bootstrap=$(sed -n 's/.*bootstrap=\([^ ]*\).*/\1/p' <<<"$up")

export CAIRN_KAFKA__BOOTSTRAP_SERVERS=${CAIRN_KAFKA__BOOTSTRAP_SERVERS:-${bootstrap:-127.0.0.1:9092}}
export CAIRN_AGENTS=${CAIRN_AGENTS:-service.demo:agents}
export CAIRN_TOPICS__PARTITIONS=${CAIRN_TOPICS__PARTITIONS:-3}
export CAIRN_LOG_JSON=${CAIRN_LOG_JSON:-false}
export CAIRN_HEALTH_PORT=${CAIRN_HEALTH_PORT:-8080}

"$PY" -m service topics create

bs=$CAIRN_KAFKA__BOOTSTRAP_SERVERS
cat <<MSG

Cairn is starting with the demo agent (Kafka at $bs).
In another terminal (source .venv/bin/activate; add --bootstrap-servers $bs if you changed the port):

  cairn invoke --session demo-1 --checkpointing --wait "What is 17 * 23, and the weather in Lisbon?"
  cairn resume --session demo-1 --wait            # continue from the checkpoint
  cairn resume --session demo-1 --answer true --wait   # approve when it asks
  cairn invoke --session demo-2 --wait "Run the slow job for 60 seconds"
  cairn cancel --session demo-2                    # from a third terminal, while it runs
  cairn watch                                      # everything, live
  cairn session show demo-1

Ctrl-C stops the service; the broker keeps running (make kafka-down stops it).

MSG

exec "$PY" -m service serve
