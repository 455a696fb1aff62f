"""``python -m koord.koordlet`` is the ``koordlet`` command."""

from .cli import main

raise SystemExit(main())
