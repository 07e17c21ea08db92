#!/usr/bin/env bash
# The gui recipe: recipes/gui/cluster.yaml over this node's GPUs, or recipes/gui/cpu.yaml without a GPU.
# Variables and arguments: see launch/common.sh and launch/README.md.
RECIPE=gui
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
