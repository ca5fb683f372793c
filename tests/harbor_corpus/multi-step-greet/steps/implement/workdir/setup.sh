#!/usr/bin/env bash
set -euo pipefail
echo seeded > seed.txt
rm -- "$0"
