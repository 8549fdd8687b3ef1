"""`python -m mlless`, which is how the local launcher starts worker processes."""
import sys

from mlless.cli import main

sys.exit(main())
