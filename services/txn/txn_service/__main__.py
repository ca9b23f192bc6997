import sys

from txn_service.main import main

sys.exit(main())
