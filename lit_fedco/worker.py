"""A worker process of a ``jobs=N`` run started as ``python -m lit_fedco.worker`` (where workers
cannot be forked from the launcher, and in place of one that died): it serves the launcher's
tasks from stdin (:func:`lit_fedco.process.serving.serve`), each a sub-run through
:func:`lit_fedco.cli.run`, and answers on a copy of its original stdout; its launcher's end
stops it (:func:`lit_fedco.process.workers.end_with_launcher`).
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Serve tasks from stdin; answers go to a copy of the original stdout, so that nothing a
    recipe or a library prints can be mistaken for one."""
    from lit_fedco.cli import run
    from lit_fedco.process.serving import handle_signals, serve
    from lit_fedco.process.workers import LAUNCHER_ENV, end_with_launcher

    handle_signals()
    if launcher := int(os.environ.get(LAUNCHER_ENV, "0") or 0):
        end_with_launcher(launcher)
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    # torch, Lightning and the run path load now, while the launcher still checks the run,
    # not after the first task arrives (a few seconds each worker would otherwise add)
    import lit_fedco.experiment.session  # noqa: F401

    serve(sys.stdin, channel, run)


if __name__ == "__main__":
    main()
