"""Python imports this at start-up in every process whose path holds this folder (segv.env, probe.env): each
test-only fault hook installs itself there when its variable is set, and nothing happens otherwise."""

import probe
import segv

segv.install_from_env()
probe.install_from_env()
