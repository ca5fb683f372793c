"""`python -m opencode_env.cli ...`: the same as `opencode-env ...`."""

import sys

from opencode_env.cli.app import main

sys.exit(main())
