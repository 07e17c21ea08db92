#!/bin/bash
set -euo pipefail
cat > backup.sh <<'SH'
#!/bin/bash
# usage: backup.sh SRC DEST
# Copies every regular file ending in .txt directly inside SRC (not in subdirectories) into DEST,
# creating DEST (and its parents) if needed, then prints "copied <n> files".
src=$1
dest=$2
mkdir -p -- "$dest"
count=0
for f in "$src"/*.txt; do
  [ -f "$f" ] || continue
  cp -- "$f" "$dest/"
  count=$((count + 1))
done
echo "copied $count files"
SH
