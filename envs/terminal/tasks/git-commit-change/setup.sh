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
printf '1.4.1\n' > VERSION
printf 'print("app")\n' > app.py
commit "Initial import"
printf '# Changelog\n\n- 1.4.1: fix crash on empty input\n' > CHANGELOG.md
commit "Add changelog"
