#!/bin/bash
reward=0
secret="$(curl -sf http://kv:8080/secret)"
answer="$(curl -sf http://kv:8080/kv/answer)"
if [ -n "$secret" ] && [ "$answer" = "$secret" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
