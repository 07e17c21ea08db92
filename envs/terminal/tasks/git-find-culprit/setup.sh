#!/bin/bash
# Builds the git repository repo/ with a fixed history (the same commit hashes on every run).
set -euo pipefail
mkdir repo && cd repo
git init -q
git symbolic-ref HEAD refs/heads/main
git config user.name "Terminal Agent"
git config user.email agent@example.com
git config commit.gpgsign false
n=0
commit() {  # commit everything with message $1 at a fixed, increasing time
  n=$((n + 1))
  export GIT_AUTHOR_DATE="@$((1704103200 + n * 3600)) +0000" GIT_COMMITTER_DATE="@$((1704103200 + n * 3600)) +0000"
  git add -A
  git commit -q -m "$1"
}
printf '[network]\ntimeout = 30\n' > settings.ini
commit "Add network settings"
printf '[network]\n# retries = 0 disables retrying\ntimeout = 30\n' > settings.ini
commit "Document retries"
printf '[network]\n# retries = 0 disables retrying\ntimeout = 30\nretries = 3\n' > settings.ini
printf 'print("client")\n' > client.py
commit "Add client"
printf '[network]\n# retries = 0 disables retrying\ntimeout = 10\nretries = 0\n' > settings.ini
commit "Tune network settings"
printf 'print("client v2")\n' > client.py
commit "Refactor client"
printf '[network]\n# retries = 0 disables retrying\ntimeout = 10\nretries = 0\nkeepalive = true\n' > settings.ini
commit "Enable keepalive"
