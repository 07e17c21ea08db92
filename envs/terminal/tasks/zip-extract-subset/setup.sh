#!/bin/bash
# Builds bundle.zip (kept out of the repository as a binary).
set -euo pipefail
python3 -I - <<'PY'
import zipfile

files = {
    "README.txt": "bundle of things\n",
    "docs/guide.md": "# Guide\nStart here.\n",
    "docs/api/reference.md": "# API\nGET /items\n",
    "docs/api/changes.txt": "v2: added /items\n",
    "src/main.c": "int main(void) { return 0; }\n",
    "src/docs/notes.md": "not the docs you are looking for\n",
}
with zipfile.ZipFile("bundle.zip", "w", zipfile.ZIP_DEFLATED) as z:
    for name, text in files.items():
        info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        z.writestr(info, text)
PY
