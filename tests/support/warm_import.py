"""A module that warm workers import ahead in the tests (``tests.support.predictors.WhereScored``): it notes
which process imported it."""

import os

_log = os.environ.get("RAYBATCH_TEST_WARM_LOG")
if _log:
    with open(_log, "a") as f:
        f.write(f"{os.getpid()}\n")
