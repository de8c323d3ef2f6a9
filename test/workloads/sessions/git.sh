#!/usr/bin/env bash
# git as a coding agent uses it: init, commit with the user's ~/.gitconfig,
# a local bare remote (clone, push, pull), worktrees, stash, a hook.
set -euo pipefail
cd "$WL_DIR"
git config --global --get user.email >/dev/null   # read from ~/.gitconfig
git init -q -b main repo && cd repo
printf 'hello\n' > README
git add README && git commit -q -m "first"
mkdir -p .git/hooks
printf '#!/bin/sh\necho hook-ran >> "$(git rev-parse --git-dir)/hook.log"\n' > .git/hooks/pre-commit
chmod +x .git/hooks/pre-commit
printf 'more\n' >> README && git commit -q -am "second"
grep -q hook-ran .git/hook.log
git init -q --bare -b main ../remote.git
git remote add origin ../remote.git
git push -q origin main
git clone -q ../remote.git ../clone
(cd ../clone && printf 'from clone\n' > NEW && git add NEW && git commit -q -m "third" && git push -q origin main)
git pull -q --ff-only origin main
test -f NEW
git worktree add -q ../wt -b feature
(cd ../wt && printf 'feature\n' > F && git add F && git commit -q -m "feature")
git worktree list | grep feature
git worktree remove ../wt
printf 'dirty\n' >> README
git stash -q && git diff --quiet && git stash pop -q
git diff --stat | grep README
git log --oneline | wc -l | grep 3
git status --short >/dev/null
echo git-ok
