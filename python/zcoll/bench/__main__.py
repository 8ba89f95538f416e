"""``python -m zcoll.bench``: see :func:`zcoll.bench.main`."""

import sys

from zcoll.bench import main

sys.exit(main())
