#!/usr/bin/env bash
# The live recipe ("deploy = train"): recipes/live/cluster.yaml over this node's GPUs, or recipes/live/cpu.yaml without a GPU.
# Variables and arguments: see launch/common.sh and launch/README.md. Beyond loopback the gateway needs CLAWR1_API_KEY.
RECIPE=live
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
