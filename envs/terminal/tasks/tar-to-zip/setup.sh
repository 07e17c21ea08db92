#!/bin/bash
# Builds logs.tar.gz (kept out of the repository as a binary).
set -euo pipefail
python3 -I - <<'PY'
import io
import tarfile

files = {
    "logs/app.log": "started\nstopped\n",
    "logs/2024/jan.log": "january\n",
    "logs/2024/feb.log": "february\n",
    "logs/README": "rotated monthly\n",
}
with tarfile.open("logs.tar.gz", "w:gz") as tar:
    for name, text in files.items():
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 1704067200, 0o644
        tar.addfile(info, io.BytesIO(data))
PY
