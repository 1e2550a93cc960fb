#!/usr/bin/env bash
# Does Chamber work on this GPU machine? Prints one JSON document: the GPUs NVML lists (UUIDs, models, MIG
# profiles), one sample per GPU with the GPM fields (SM, tensor and DRAM activity, usage), and a one-GPU job that
# runs a small CUDA workload (PyTorch if installed, else nvidia-smi) through the whole system (embedded NATS and
# Redis, node agent, process executor): placed, started, finished, with the CUDA_VISIBLE_DEVICES it was given.
# Exit status 0 when all of it worked.
#
# Usage: deploy/device-check.sh [--timeout SECONDS] [--json]
# Needs Python 3.11 and make (it runs `make install` once when .venv is missing). Without GPUs, a dry run
# against the tests' fake NVML: CHAMBER_NVML_MODULE=tests.support.fakenvml:TWO_H100 deploy/device-check.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ ! -x .venv/bin/python ]; then
  make install >&2
fi
# the source roots (as the Makefile sets them, so a .venv older than the checkout still finds every module), and
# the repository itself (the tests' fake NVML for dry runs)
roots=(libs/common libs/cli libs/sim services/collector services/scheduler services/health services/quota
       services/gateway)
path="$root"
for r in "${roots[@]}"; do path="$path:$root/$r"; done
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python -m chamber.cli.main device-check "$@"
