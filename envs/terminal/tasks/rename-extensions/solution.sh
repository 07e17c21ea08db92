#!/bin/bash
set -euo pipefail
find photos -type f -name '*.jpeg' -exec sh -c 'for f; do mv "$f" "${f%.jpeg}.jpg"; done' sh {} +
