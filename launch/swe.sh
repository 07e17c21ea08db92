#!/usr/bin/env bash
# The swe recipe: recipes/swe/cluster.yaml over this node's GPUs, or recipes/swe/cpu.yaml without a GPU.
# Variables and arguments: see launch/common.sh and launch/README.md.
RECIPE=swe
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
