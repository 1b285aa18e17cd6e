"""`python -m relay` is the same program as `blind-relay`."""

from relay.cli import main

raise SystemExit(main())
