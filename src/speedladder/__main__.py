import sys

from speedladder.cli import main

sys.exit(main())
