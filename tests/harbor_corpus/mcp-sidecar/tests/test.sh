#!/bin/bash
reward=0
if curl -sf http://mcp-server:8000/guestbook | grep -qx harbor; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
