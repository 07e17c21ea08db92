#!/bin/bash
set -euo pipefail
scratch=$(mktemp -d ./.unpack.XXXXXX)
tar -xzf logs.tar.gz -C "$scratch"
(cd "$scratch" && zip -qr ../logs.zip logs)
rm -rf "$scratch"
