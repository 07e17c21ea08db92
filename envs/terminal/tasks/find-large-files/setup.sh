#!/bin/bash
# Builds data/ with files of chosen sizes (no need to keep large files in the repository).
set -euo pipefail
mkdir -p data/logs data/deep/x/y data/empty
make_file() { head -c "$2" /dev/zero | tr '\0' 'a' > "$1"; }
make_file data/a.bin 20000
make_file data/logs/big.log 10241
make_file data/logs/edge.log 10240
make_file data/small.txt 100
make_file data/deep/x/y/huge.dat 50000
make_file "data/space name.bin" 12000
make_file data/deep/tiny.dat 1
make_file outside.bin 40000
