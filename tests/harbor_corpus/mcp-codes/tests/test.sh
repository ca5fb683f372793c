#!/bin/bash
reward=0
if [ "$(cat /app/code.txt 2>/dev/null)" = "HBR-$(printf 'codes:harbor' | sha256sum | cut -c1-10 | tr a-f A-F)" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
