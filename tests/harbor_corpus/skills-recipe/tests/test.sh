#!/bin/bash
reward=0
if [ "$(head -n 1 /app/RELEASE.md 2>/dev/null)" = "# 2.1.0" ] && grep -qi '^- the parser accepts tabs\.$' /app/RELEASE.md; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
