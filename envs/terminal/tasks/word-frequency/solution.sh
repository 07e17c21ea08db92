#!/bin/bash
set -euo pipefail
tr -cs 'A-Za-z' '\n' < article.txt | tr 'A-Z' 'a-z' | grep -v '^$' | LC_ALL=C sort | uniq -c \
  | LC_ALL=C sort -k1,1nr -k2,2 | head -n 5 | awk '{print $1, $2}' > top_words.txt
