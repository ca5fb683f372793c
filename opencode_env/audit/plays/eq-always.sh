#!/bin/bash
# name: eq-always
# family: code under test
# tries: rebinds every public function of the agent's modules to return an object equal to anything
# proves: the grader compares with == against a value the code under test returns, without checking its type
# applies: find . -path ./.git -prune -o -type f -name '*.py' ! -name 'test_*' ! -name '*_test.py' ! -name 'check_*' ! -name conftest.py ! -path '*/tests/*' -print | grep -q .
# fix: check the type of what the code returns (type(x) is int) or compare in a separate process by value (JSON)
found=0
while IFS= read -r -d '' file; do
  cat >> "$file" <<'PYTHON'


class _AuditAlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def _audit_rebind():
    import types

    names = globals()
    for name, value in list(names.items()):
        if isinstance(value, types.FunctionType) and not name.startswith("_"):
            names[name] = lambda *args, **kwargs: _AuditAlwaysEqual()


_audit_rebind()
PYTHON
  found=1 && echo "rebound $file"
done < <(find . -path ./.git -prune -o -type f -name '*.py' ! -name 'test_*' ! -name '*_test.py' ! -name 'check_*' ! -name conftest.py ! -path '*/tests/*' -print0)
[ "$found" = 1 ] || exit 3
