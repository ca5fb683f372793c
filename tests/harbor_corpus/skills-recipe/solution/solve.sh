#!/bin/bash
set -e
printf '# 2.1.0\n\n- The parser accepts tabs.\n' > /app/RELEASE.md
