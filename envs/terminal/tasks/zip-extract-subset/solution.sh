#!/bin/bash
set -euo pipefail
unzip -q bundle.zip 'docs/*' -d docs_only
