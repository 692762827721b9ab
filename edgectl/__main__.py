import sys

from edgectl.cli import main

sys.exit(main())
