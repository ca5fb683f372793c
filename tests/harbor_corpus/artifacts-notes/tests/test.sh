#!/bin/bash
mkdir -p /logs/artifacts
reward=0
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then
  reward=1
fi
echo "answer: $(head -c 100 /app/answer.txt 2>/dev/null || echo none); reward $reward" > /logs/artifacts/report.txt
echo "$reward" > /logs/verifier/reward.txt
