"""``python -m mqstore_cli``: the same as the ``mqstore`` console script."""

import sys

from mqstore_cli.main import main

sys.exit(main())
