"""`python -m keras_transformer.cli ...`: the command run inside Python (the console is left as
it is, as for `keras_transformer.cli.main`)."""

import sys

from keras_transformer.cli import main

sys.exit(main())
