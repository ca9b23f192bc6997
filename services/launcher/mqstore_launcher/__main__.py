"""``python -m mqstore_launcher``: the same as ``python -m mqstore_launcher.main`` (``make run``)."""

import sys

from mqstore_launcher.main import main

sys.exit(main())
