"""``python -m ncclscope``."""

from ncclscope.cli import main

main()
