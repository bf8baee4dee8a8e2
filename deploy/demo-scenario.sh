#!/usr/bin/env bash
# Walks through the demo against a running service (`make run` in another terminal): a turn that
# pauses at every checkpoint, an approval interrupt answered, then a slow job cancelled mid-run.
# Usage: deploy/demo-scenario.sh [session-prefix]   (CAIRN_ settings as for the service)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${CAIRN_PYTHON:-.venv/bin/python}
cairn() { "$PY" -m service "$@"; }
prefix=${1:-scenario-$(date +%s)}
tour="$prefix-tour"
job="$prefix-job"

step() { printf '\n\033[1m$ cairn %s\033[0m\n' "$*"; cairn "$@"; }

step invoke --session "$tour" --checkpointing --wait "What is 17 * 23, and the weather in Lisbon?"
step resume --session "$tour" --wait    # runs the calculator and the forecast, pauses after them
step resume --session "$tour" --wait    # the model asks for approval: pauses before the tool
step resume --session "$tour" --wait    # the approval tool raises an interrupt
step resume --session "$tour" --answer true --wait
step resume --session "$tour" --wait    # the final answer uses every tool result
step session show "$tour" --results 1

step invoke --session "$job" --command-id "$job-run" "Run the slow job for 120 seconds"
# The job runs once its after_model boundary is committed; poll for it rather than guess.
for _ in $(seq 1 120); do
	if cairn session show "$job" | grep -q "running: command $job-run"; then break; fi
	sleep 0.5
done
step cancel --session "$job" --command "$job-run" --message "Stopped from the demo" --wait --timeout 60
