"""The vcuda admission webhook: validates vcuda requests and rewrites pods.

Pure parts, tested by calling them:

- ``quantity``: Kubernetes resource quantities, read exactly;
- ``config``: the policy settings (``Config``) and their JSON file;
- ``pod``: the pod fields vcuda reads, as typed values;
- ``patch``: JSON Patch operations built one by one;
- ``policy``: ``decide(pod, operation, old_pod, config) -> Decision``;
- ``review``: the AdmissionReview wire format;
- ``admission``: ``admit(body, config) -> Answer``, body to answer;
- ``remembered``: the decisions on pods of one template, made once.

Parts with I/O: ``tls`` (the checked, reloaded serving certificate), ``pki``
(a small ECDSA CA, shared with ``certs``), ``logs`` (structlog JSON lines),
``metrics`` (Prometheus), ``kube`` (the API calls, shared with the extender),
``largest_gpu`` (the cluster's largest GPU, from its Nodes), ``server`` (the
``vcuda-webhook`` command), and ``certs`` (the ``vcuda-certs`` command).
Nothing is imported here, so a caller pays only for the modules it uses.
"""
