#!/bin/bash
reward=0
if [ -s /app/ticket.txt ] && [ "$(cat /app/ticket.txt)" = "$(cat /etc/ticket)" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
