"""The vcuda scheduler extender: per-GPU placement behind kube-scheduler's extender API v1.

Pure parts, tested by calling them:

- ``policy``: a pod's GPU need, a node's GPUs and their use, fit, score, choice;
- ``wire``: ExtenderArgs, ExtenderBindingArgs and the answers, as JSON.

Parts with I/O: ``nodes`` (the view of the vcuda Nodes, from a list and a watch),
``bind`` (ledger then Binding, each write conditional, through
``webhook.kube``'s API calls), ``service`` (the three verbs, body to body), ``server``
(the ``vcuda-scheduler-extender`` command).
"""
