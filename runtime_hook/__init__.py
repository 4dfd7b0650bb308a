"""Node-side parts of vcuda: the OCI hook, the standalone runner and the node agent."""
