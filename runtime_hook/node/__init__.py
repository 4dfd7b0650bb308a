"""The node agent ``vcuda-node``: install, advertise, observe.

- ``install``: libvcuda.so, the OCI hook and the runtime's ``vcuda`` handler
  on the host (``hook_files``, ``runtime_config``, ``host_files``);
- ``agent``: the ``run`` loop; ``advertise`` writes the GPU inventory and the
  node's extended resources from ``nvml``;
- ``observe`` and ``metrics``: per-container and per-GPU figures for
  Prometheus, from ``workloads`` (the hook's ledger, vcuda-run commands), the
  shim's ``account`` files and ``processes`` (container pids to host pids);
- ``cli``: the command line (``main``, the ``vcuda-node`` command); ``logs``: JSON lines.

Nothing is imported here, so a module of the agent loads only what it uses.
"""
