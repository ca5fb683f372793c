#!/bin/bash
# The step's own verifier, over the task's tests/ (lib.sh comes from there); its setup seeded seed.txt.
. /tests/lib.sh
check() {
  test "$(cat /app/seed.txt)" = seeded && test ! -e /app/setup.sh &&
    test "$(bash /app/greet.sh "$EXPECTED_NAME")" = "Hello, $EXPECTED_NAME!"
}
grade check
