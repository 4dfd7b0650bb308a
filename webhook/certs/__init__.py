"""`vcuda-certs`: creates and rotates the webhook's CA and serving certificate.

The pieces, each with one job: `observe` reads the Secret and the webhook
configuration into facts, `plan` decides the next step from those facts and
the time (pure), `act` carries a step out, `cluster` talks to the API server,
and `cli` is the command.
"""

from __future__ import annotations

from webhook.certs.plan import Action, Policy, decide

__all__ = ["Action", "Policy", "decide"]
