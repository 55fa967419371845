"""``python -m forkq``: the same as the ``forkq`` command."""

from forkq.cli import main

raise SystemExit(main())
