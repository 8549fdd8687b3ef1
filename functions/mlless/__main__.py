"""The `mlless` command, and `python -m mlless`, which is how the local launcher starts worker processes."""
import sys


def run() -> int:
    """The command line, imported here: a Ctrl-C during its imports (most of a second) ends in one line, as one
    during a job does, not in a traceback."""
    try:
        from mlless.cli import main
    except KeyboardInterrupt:
        from mlless.contract import EXIT_INTERRUPTED

        print("mlless: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return main()


if __name__ == "__main__":
    sys.exit(run())
