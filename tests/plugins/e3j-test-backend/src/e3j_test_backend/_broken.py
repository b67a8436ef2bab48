"""A plugin module that cannot be imported (as if a dependency were missing)."""

raise ImportError("e3j_test_backend._broken needs libe3j_missing, which is not installed")
