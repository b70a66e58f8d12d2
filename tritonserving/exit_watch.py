"""The parent process of one `tritonserver`: it waits for the server and writes down how it ended.

Only a process's parent learns its exit status (POSIX `waitpid`), and the Conch process that starts a server is not
the one that later notices it is gone (another worker process, or a restarted Conch). So
`tritonserving.server.start_server` runs this file (standard library only, `python -I -S exit_watch.py FD COMMAND...`)
and it:

1. starts COMMAND (the `tritonserver` command line) in a session of its own, so the server leads its own process
   group as before and a signal to that group (`stop_server`) never reaches the watcher;
2. writes the server's pid, or `error <reason>` when it cannot be started, as one line to file descriptor FD (a
   pipe `start_server` reads), then closes it;
3. waits for the server and appends one line to its stdout, which is the server's log:
   `# conch: tritonserver pid 1234 was stopped by signal SIGKILL (9)` or `# conch: tritonserver pid 1234 exited
   with code 1` (`tritonserving.server.exit_status` reads it back).

SIGINT, SIGTERM and SIGHUP do not stop the watcher: it ends on its own once the server has ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _keep_waiting(signum: int, frame: object) -> None:
    """Do nothing. Unlike SIG_IGN, a handler is reset to the default in the server the watcher executes."""


def describe(pid: int, returncode: int) -> str:
    """The log line for server `pid` that ended with `returncode` (Popen's: negative is the signal's number)."""
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"# conch: tritonserver pid {pid} was stopped by signal {name} ({number})"
    return f"# conch: tritonserver pid {pid} exited with code {returncode}"


def main(arguments: list[str]) -> int:
    report_fd, command = int(arguments[0]), arguments[1:]
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _keep_waiting)
    with os.fdopen(report_fd, "w") as report:
        try:
            # stdin, stdout and stderr are the watcher's own (the log); the report pipe is closed in the server.
            server = subprocess.Popen(command, start_new_session=True, close_fds=True)
        except OSError as exc:
            report.write(f"error {exc}\n")
            return 127
        report.write(f"{server.pid}\n")
    returncode = server.wait()
    sys.stdout.write(describe(server.pid, returncode) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
