"""SLURM as an add-on (`scheduler.type=slurm`): the scheduler, pre-flight checks, the run's jobs, the
controller as a job, and a local SLURM to try it on."""
