#!/bin/bash
# The scratch directory that must stay out of the backup (kept out of the repository's tree).
set -euo pipefail
mkdir -p project/tmp/cache
printf 'cached\n' > project/tmp/cache/blob.bin
printf 'scratch\n' > project/tmp/notes.txt
