"""``python -m commitlog_service``: the same as ``python -m commitlog_service.main``."""

import sys

from commitlog_service.main import main

sys.exit(main())
