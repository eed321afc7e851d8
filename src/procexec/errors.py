"""One exception type for bad input: the CLI prints it as one line and exits 2."""


class ProcexecError(Exception):
    """Bad input from the user (config, dataset line, model output file...).

    The message must name the problem and where it is (file:line, config key).
    """
