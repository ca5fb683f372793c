#!/bin/bash
set -e
curl -sf http://kv:8080/secret > /tmp/secret
curl -sf -X PUT --data-binary @/tmp/secret http://kv:8080/kv/answer
