#!/bin/bash
reward=0
if command -v wordcount > /dev/null && [ "$(printf 'one two  three\nfour\n' | wordcount)" = 4 ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
