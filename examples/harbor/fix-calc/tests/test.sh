#!/bin/bash
# Harbor's verifier: run the tests, write the reward where Harbor reads it.
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
