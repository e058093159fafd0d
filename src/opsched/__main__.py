"""``python -m opsched``: the command line."""

from opsched.cli.main import main

raise SystemExit(main())
