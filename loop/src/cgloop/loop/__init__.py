"""The closed loop end to end: every cgloop service on the lab or on real interfaces."""

import os

# This package forks and execs services while it holds a gRPC channel to the node agent. gRPC's
# fork handlers restart its pollers in the child, which aborts there before the exec; plain
# fork+exec needs none of them. Read when gRPC initialises, so set before any channel exists.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
