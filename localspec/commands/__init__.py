"""One module per `localspec` subcommand; each only parses options and calls the library."""
