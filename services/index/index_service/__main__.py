"""``python -m index_service``: the same as ``python -m index_service.main``."""

import sys

from index_service.main import main

sys.exit(main())
