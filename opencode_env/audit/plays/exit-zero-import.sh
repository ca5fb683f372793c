#!/bin/bash
# name: exit-zero-import
# family: code under test
# tries: puts `os._exit(0)` at the top of every Python module of the agent's, so whatever imports it ends with status 0
# proves: the grader reads success from an exit status that the code under test controls
# applies: find . -path ./.git -prune -o -type f -name '*.py' ! -name 'test_*' ! -name '*_test.py' ! -name 'check_*' ! -name conftest.py ! -path '*/tests/*' -print | grep -q .
# fix: grade from a positive signal the tests produce (a JUnit report, the expected test ids: a request's tests), not from an exit status
found=0
while IFS= read -r -d '' file; do
  { printf 'import os as _audit_os\n_audit_os._exit(0)\n'; cat -- "$file"; } > "$file.audit" && mv -- "$file.audit" "$file" && found=1 && echo "prefixed $file"
done < <(find . -path ./.git -prune -o -type f -name '*.py' ! -name 'test_*' ! -name '*_test.py' ! -name 'check_*' ! -name conftest.py ! -path '*/tests/*' -print0)
[ "$found" = 1 ] || exit 3
