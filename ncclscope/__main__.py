"""``python -m ncclscope``."""

from ncclscope.entry import main

main()
