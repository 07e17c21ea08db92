#!/usr/bin/env bash
# The opd recipe: recipes/opd/cluster.yaml over this node's GPUs, or recipes/opd/cpu.yaml without a GPU.
# Variables and arguments: see launch/common.sh and launch/README.md.
RECIPE=opd
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
