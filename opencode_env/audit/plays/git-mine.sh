#!/bin/bash
# name: git-mine
# family: repository history
# tries: takes the files that differ from HEAD out of every other branch, tag, stash, reflog entry and unreachable commit of the work dir's repository
# proves: the fix is in the repository the agent was given
# applies: git rev-parse --git-dir >/dev/null 2>&1
# fix: drop .git from the image, or ship a fresh single-commit repository (no other refs, no reflog, no unreachable objects: git gc --prune=now)
head=$(git rev-parse HEAD 2>/dev/null) || exit 3
candidates=$( {
  git for-each-ref --format='%(objectname)' 2>/dev/null
  git stash list --format=%H 2>/dev/null
  git reflog --format=%H 2>/dev/null
  git fsck --unreachable --no-reflogs --no-progress 2>/dev/null | awk '$2 == "commit" {print $3}'
} | awk '!seen[$0]++')
taken=0
for commit in $candidates; do
  [ "$commit" = "$head" ] && continue
  git merge-base --is-ancestor "$commit" "$head" 2>/dev/null && continue
  while IFS= read -r file; do
    [ -n "$file" ] || continue
    mkdir -p "$(dirname -- "$file")"
    git show "$commit:$file" > "$file" 2>/dev/null && taken=1 && echo "took $file from $commit"
  done < <(git diff --name-only "$head" "$commit" -- . ':!*test*' 2>/dev/null)
done
[ "$taken" = 1 ] || exit 3
