"""On the device machine, each failure's report is appended to ``$E3J_FAILURES_FILE`` as it happens,
so a run cut short by the lease's time limit still tells what failed and why (pytest prints its
summary only at the end)."""

import os


def pytest_runtest_logreport(report):
    path = os.environ.get("E3J_FAILURES_FILE")
    # under pytest-xdist the controller sees each worker's report again (with ``node`` set): written once
    if path and report.failed and getattr(report, "node", None) is None:
        with open(path, "a") as fh:
            fh.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")
