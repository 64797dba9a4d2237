"""One exception type for bad user input: the CLI prints its message as one line and exits with status 2."""


class InputError(ValueError):
    """Bad input (config, trace, request). The message names the file, field or row and what was expected."""
