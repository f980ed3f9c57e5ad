"""`python -m stepscope.app.cli`: the command, without the installed console script
(tests, the dashboard's background attach, a checkout that was never installed)."""

import sys

from stepscope.app.cli.main import main

sys.exit(main())
