"""Python imports this at start-up in every process whose PYTHONPATH holds this folder (segv.env): the test-only
fault hooks install themselves there when their variable is set, and nothing happens otherwise."""

import segv

segv.install_from_env()
