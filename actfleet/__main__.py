"""`python -m actfleet` is the `actfleet` command."""

from actfleet.cli import main

main()
