#!/bin/bash
set -euo pipefail
tr 'A-Z' 'a-z' < emails.txt | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -v '^$' | LC_ALL=C sort -u > unique_emails.txt
