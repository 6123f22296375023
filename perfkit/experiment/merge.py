"""Where the LEDGER.md merge driver was before experiment/ had rooms: a repository that `perfkit init` set
up earlier names `python -m perfkit.experiment.merge` in its git config, and keeps working. `perfkit init`
now writes perfkit.experiment.repo.merge (and rewrites this entry when run again)."""

import sys

from perfkit.experiment.repo.merge import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
