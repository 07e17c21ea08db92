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
printf '# Notes\n- draft\n' > notes.md
printf 'scratch\n' > tmp.txt
printf 'main\n' > main.txt
commit "Start project"
printf '# Notes\n- decided: use sqlite\n- todo: backups\n' > notes.md
commit "Update notes"
git rm -q notes.md tmp.txt
commit "Clean up old files"
printf 'main v2\n' > main.txt
commit "Update main"
