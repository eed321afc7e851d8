#!/bin/sh
# Print what the scheduler gave this job: `sh dump_env.sh LABEL [extra...]`.
sleep "${DUMP_ENV_SLEEP:-1}"
echo "job=$1 host=$(hostname) SLURM_JOB_ID=${SLURM_JOB_ID:-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} SLURM_JOB_GPUS=${SLURM_JOB_GPUS:-} SLURM_GPUS=${SLURM_GPUS:-} ${2:-}"
