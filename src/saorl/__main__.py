"""`python -m saorl ...` is the `saorl` console script."""

import os
import sys

from saorl.cli.main import main

if __name__ == "__main__":
    code = main()
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank started by torchrun
        # torch's teardown at interpreter exit sometimes aborts a rank ("terminate called
        # without an active exception", SIGABRT) after the run has finished, turning success
        # into failure. By now every file is written and the process group is destroyed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
