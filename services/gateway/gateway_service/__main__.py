import sys

from gateway_service.main import main

sys.exit(main())
