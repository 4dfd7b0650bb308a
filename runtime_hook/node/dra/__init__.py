"""vcuda as a Dynamic Resource Allocation driver (``resource.k8s.io/v1``, driver ``vcuda.io``).

- ``slices``: the node's ResourceSlice (GPUs with consumable ``cores`` and
  ``memory``), kept current by ``publish`` through ``kube``;
- ``plugin``: kubelet's plugin registration and DRA gRPC service;
- ``allocation``: a claim's allocation results as shares of GPUs;
- ``prepare``: shares into the node ledger, the limits file and a CDI spec
  (``cdi``), and back;
- ``driver``: all of it for ``vcuda-node run --dra`` (:class:`~.driver.Driver`).

Nothing is imported here, so that the command line reads the modules' defaults
without loading the driver.
"""
