#!/bin/bash
set -u
reward=0
if [ -x /workspace/greet.sh ] && [ "$(/workspace/greet.sh)" = "$EXPECTED_GREETING" ] \
  && [ "$(GREETER_PROJECT=other /workspace/greet.sh)" = "Hello from other!" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
