#!/usr/bin/env bash
# The combined recipe: recipes/combined/cluster.yaml over this node's GPUs, or recipes/combined/cpu.yaml without a GPU.
# Variables and arguments: see launch/common.sh and launch/README.md.
RECIPE=combined
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
