#!/usr/bin/env bash
# The binary_rl recipe: recipes/binary_rl/cluster.yaml over this node's GPUs, or recipes/binary_rl/cpu.yaml without a GPU.
# Variables and arguments: see launch/common.sh and launch/README.md.
RECIPE=binary_rl
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
