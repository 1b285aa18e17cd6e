from cosmictui.cli import main

raise SystemExit(main())
