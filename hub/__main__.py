import sys

from hub.cli import main

sys.exit(main())
