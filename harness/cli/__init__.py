"""The ``harness`` command line: one module per command (``ls``, ``validate``, ``run``,
``status``/``cancel``, ``evaluate``, ``report``, ``bench``, ``data``), the parser in
:mod:`harness.cli.parser`, and here :func:`main`: parse, check the ``HARNESS_*`` environment
variables (:mod:`harness.contract.env`), load ``--plugin`` modules, run the command, and turn
every error a user can fix into one line and exit status 2.
"""

from __future__ import annotations

import importlib
import logging
import sys

from harness.cli.checks import debug_wanted, unexpected_error, weights_errors
from harness.cli.parser import build_parser


def run_command(args) -> int:
    """Import the command's module (``args.fn`` = ``"module:function"``) and run it."""
    module, _, name = args.fn.partition(":")
    return int(getattr(importlib.import_module(module), name)(args) or 0)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)  # --help and bad flags exit here, importing little
    from harness.config.includes import SuiteError
    from harness.contract.env import check_environment, misspelled_variables
    from harness.contract.errors import DamagedFile, UsageError
    from harness.executors.devices import ExecutorError
    from harness.registry.core import RegistryError, import_plugins, load_plugins

    # KEY=VALUE after an option (`run s.yaml --force recipe.epochs=1`) lands in `extra`:
    # overrides wherever they stand on the line.
    if hasattr(args, "overrides"):
        args.overrides += [e for e in extra if "=" in e and not e.startswith("-")]
        extra = [e for e in extra if e not in args.overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    # Before any command reads or writes anything: a bad value read deep inside a cell was a
    # traceback (or an "unexpected error") minutes into a run.
    if problems := check_environment():
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    for warning in misspelled_variables():
        print(f"warning: {warning}", file=sys.stderr)
    try:
        if getattr(args, "plugin", None):
            load_plugins(args.plugin)
        # $HARNESS_PLUGINS too, before the command: imported at the first registry lookup,
        # a module that raised did so after `report` had refreshed its index.
        import_plugins()
        return run_command(args)
    except SuiteError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    except (RegistryError, FileNotFoundError, ExecutorError, DamagedFile, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        return 0
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM turned into one by the executors
        print(
            "\ninterrupted: finished cells are kept; re-run the same command to resume",
            file=sys.stderr,
        )
        return 128 + getattr(exc, "signum", 2)  # 130 for SIGINT, 143 for SIGTERM, as shells do
    except OSError as exc:  # the file system refused: one line naming the path
        if debug_wanted(args):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug or an input no layer names yet: one line, not a traceback
        if isinstance(exc, weights_errors()):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if debug_wanted(args):
            raise
        return unexpected_error(exc)
