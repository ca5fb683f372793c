#!/bin/bash
expected=43
if [ "$(tr -d '[:space:]' < /app/total.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
