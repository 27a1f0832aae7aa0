"""Evidence taken while a stalled job still lives (issue #27).

When a stall passes ``--collect-at``, the agent on each node asks the job's PyTorch
processes for their Flight Recorder dumps and Python stacks, takes a stack from outside
(py-spy) where a process does not answer, asks NCCL's RAS for the job's state, and writes
all of it, with the followed logs' tails and the stall's telemetry, into one folder under
``--out`` with a manifest (:mod:`ncclscope.evidence.manifest`).  ``ncclscope analyze``
reads such a folder beside the logs.

Each asker is bounded in time, never raises for what a peer did (an answer missing,
late, truncated or garbage becomes an :class:`~ncclscope.evidence.manifest.Ask` with
its outcome and reason), and runs off the agent's sampling thread.
"""
