import sys

from confcal.cli import main

sys.exit(main())
