"""`python -m bench.api`: the benchmark; `_load` and `_seed` are the processes it starts."""

import sys

from bench.api import main
from bench.api.load import load_main
from bench.api.server import seed_main

if sys.argv[1:2] == ["_load"]:
    load_main(sys.argv[2:])
elif sys.argv[1:2] == ["_seed"]:
    seed_main()
else:
    main(sys.argv[1:])
