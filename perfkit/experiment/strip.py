"""Where the notebook clean filter was before experiment/ had rooms: a repository that `perfkit init` set
up earlier names `python -m perfkit.experiment.strip` in its git config, and keeps working. `perfkit init`
now writes perfkit.experiment.repo.strip (and rewrites this entry when run again)."""

import sys

from perfkit.experiment.repo.strip import main

if __name__ == "__main__":
    sys.exit(main())
