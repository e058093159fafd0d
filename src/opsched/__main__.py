from opsched.cli.main import main

raise SystemExit(main())
