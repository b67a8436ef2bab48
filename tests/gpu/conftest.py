"""On the device machine, each failure's report is appended to ``$E3J_FAILURES_FILE`` as it happens,
so a run cut short by the lease's time limit still tells what failed and why (pytest prints its
summary only at the end)."""

import os


def pytest_runtest_logreport(report):
    path = os.environ.get("E3J_FAILURES_FILE")
    if path and report.failed and os.environ.get("PYTEST_XDIST_WORKER", "gw") != "":
        with open(path, "a") as fh:
            fh.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")
