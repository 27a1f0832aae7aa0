"""The model: the job's tables, built from what the parsers read.

Identity (ranks, hosts, communicators), the collectives matched across ranks, the
attempts a file holds, and the step timeline; :class:`Analysis` holds them all.  The
detectors and the outputs read these tables and never parse.
"""

from __future__ import annotations

from ncclscope.model.tables import Analysis, Built, Gap, Progress

__all__ = ["Analysis", "Built", "Gap", "Progress"]
