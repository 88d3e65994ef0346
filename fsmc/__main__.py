import sys

from fsmc.cli import main

sys.exit(main())
