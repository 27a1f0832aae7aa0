#!/bin/bash
# Slurm Epilog snippet (slurm.conf: Epilog=/etc/slurm/epilog.d/*): removes the job's
# Prometheus target file where the batch script could not (its node lost, the batch shell
# killed), so no agent of a finished job is left "down".  Runs as root on every node of
# the job; removing a file that is already gone is fine.  Use the same directory as
# NCCLSCOPE_SD_DIR in train.sbatch.
NCCLSCOPE_SD_DIR=${NCCLSCOPE_SD_DIR:-/shared/prometheus/ncclscope.d}
if [[ -n ${SLURM_JOB_ID:-} ]]; then
  rm -f "$NCCLSCOPE_SD_DIR/ncclscope-$SLURM_JOB_ID.json"
fi
exit 0
