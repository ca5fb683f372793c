#!/bin/bash
# The fallback verifier (a step without tests/test.sh of its own): greet.sh says Hello.
. /tests/lib.sh
grade test "$(bash /app/greet.sh 2>/dev/null)" = "Hello"
