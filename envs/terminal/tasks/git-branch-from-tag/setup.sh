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
printf '1.0.0\n' > VERSION
printf 'def serve():\n    return "v1"\n' > app.py
commit "Initial version"
printf 'def serve():\n    return "v1.0"\n' > app.py
commit "Polish response"
git tag -a v1.0 -m "Version 1.0"
printf '1.1.0-dev\n' > VERSION
commit "Start 1.1 development"
printf 'def serve():\n    return "v1.1"\n\n\ndef metrics():\n    return {}\n' > app.py
commit "Add metrics"
