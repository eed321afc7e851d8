"""`python -m snakemake`, with a remote executor's status polling held at --seconds-between-status-checks.

The SLURM plugin adds 10 s to the wait after every status check that sees no job
finish (up to 180 s): right on a cluster, whose jobs run for hours, but in a test
whose jobs take seconds it leaves the test idle for most of a minute per job
(measured: 19 s to notice a cancelled job, 27 s a finished one, 33 s to shut
down). Only the wait between checks changes; what is submitted and how a job's
state is read stay the plugin's own.

    python tests/snakemake_steady_polling.py --profile h200 ...
"""

from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

RemoteExecutor.next_seconds_between_status_checks = property(
    lambda self: self.workflow.remote_execution_settings.seconds_between_status_checks,
    lambda self, value: None,  # the plugin's back-off, ignored
)

if __name__ == "__main__":
    from snakemake.cli import main

    main()
