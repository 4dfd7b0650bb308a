"""The `vcuda-certs` command: flags, logging, the Kubernetes client, exit status."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from kubernetes import client

from runtime_hook.contract import CredentialsError, api_client, version_flag
from webhook.certs.act import Clock, Issuing
from webhook.certs.cluster import Cluster, ClusterError, DryRun, Target
from webhook.certs.plan import Policy
from webhook.certs.runner import Reader, SystemClock, run
from webhook.logs import make_logger

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

_DESCRIPTION = """\
Creates and rotates the TLS certificates of the vcuda admission webhook.

  ensure   create the CA and serving certificate if the Secret is missing, write
           the CA into the webhook configuration's caBundle, and repair what is
           broken (missing or mismatched files, caBundle out of date).
  rotate   everything ensure does, plus: renew the serving certificate after two
           thirds of its life, and rotate the CA with an overlap (the new CA joins
           caBundle first, the serving certificate switches to it after
           --propagation, the old CA leaves caBundle after another --propagation).

Every step is one write recorded in the Secret, so a run can be interrupted
anywhere and the next run continues; the API server is never shown a serving
certificate it does not trust. Logs are JSON lines on stderr.
"""


def main(argv: Sequence[str] | None = None, clock: Clock | None = None) -> int:
    """Run the command; return the exit status (0 done, 1 failed, 2 bad usage)."""
    args = _parser().parse_args(argv)
    log = make_logger(sys.stderr.buffer).bind(command=args.command, dry_run=args.dry_run)
    try:
        propagation = _duration(args.propagation, "--propagation")
        serving_validity = _duration(args.serving_validity, "--serving-validity")
        ca_validity = _duration(args.ca_validity, "--ca-validity")
        max_wait = _duration(args.max_wait, "--max-wait")
        _check_lifetimes(propagation, serving_validity, ca_validity)
    except ValueError as error:
        print(f"vcuda-certs: error: {error}", file=sys.stderr)
        return 2
    namespace = args.namespace or _default_namespace()
    dns_names = (f"{args.service}.{namespace}.svc",
                 f"{args.service}.{namespace}.svc.{args.cluster_domain}")
    policy = Policy(dns_names, propagation, rotate=args.command == "rotate",
                    renew_ca=getattr(args, "renew_ca", False),
                    renew_serving=getattr(args, "renew_serving", False))
    issuing = Issuing(namespace, args.secret, dns_names, ca_validity, serving_validity)
    clock = clock or SystemClock()
    try:
        real = Cluster(_api_client(args.kubeconfig),
                       Target(namespace, args.secret, args.webhook_config), clock.sleep)
        cluster: Reader = real
        if args.dry_run:  # nothing is written, so nothing needs to settle: no sleeping either
            cluster, clock, max_wait = DryRun(real), _NoSleep(clock), timedelta(0)
        outcome = run(cluster, clock, policy, issuing, log, max_wait=max_wait.total_seconds())
    except ClusterError as error:
        log.error("failed", error=str(error))
        return 1
    until = getattr(outcome.last, "until", None)  # a Wait's
    log.info("finished", steps=list(outcome.steps), next_step_at=until and until.isoformat())
    return 0


class _NoSleep:
    """A dry run's clock: the time as it is, and waits skipped."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def now(self) -> datetime:
        return self._clock.now()

    def sleep(self, seconds: float) -> None:
        pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vcuda-certs", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ensure = commands.add_parser("ensure", help="create or repair the certificates",
                                 description="Create or repair the webhook's certificates.")
    rotate = commands.add_parser("rotate", help="ensure, then renew and rotate when due",
                                 description="Ensure, then renew and rotate when due.")
    for sub in (ensure, rotate):
        _common_flags(sub)
    rotate.add_argument("--renew-ca", action="store_true",
                        help="start a CA rotation now even if it is not due (the old CA still "
                             "overlaps for two --propagation periods)")
    rotate.add_argument("--renew-serving", action="store_true",
                        help="renew the serving certificate now even if it is not due")
    return parser


def _common_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--namespace", help="namespace of the Secret and the Service (default: this pod's "
                            "namespace, else vcuda-system)")
    add("--secret", default="vcuda-webhook-tls",
        help="Secret holding the CA and the serving pair (default: %(default)s)")
    add("--service", default="vcuda-webhook",
        help="Service of the webhook; the certificate is for <service>.<namespace>.svc "
             "(default: %(default)s)")
    add("--cluster-domain", default="cluster.local",
        help="the cluster's DNS domain, for the second name <service>.<namespace>.svc.<domain> "
             "(default: %(default)s)")
    add("--webhook-config", default="vcuda-webhook",
        help="MutatingWebhookConfiguration whose caBundle the tool writes (default: %(default)s)")
    add("--propagation", default="180",
        help="time a change takes to reach the API server and the webhook pods: kubelet sync "
             "period plus the webhook's reload; each step waits this long after the previous "
             "(seconds, or with s/m/h/d; default: %(default)s)")
    add("--max-wait", default="0",
        help="sleep through waits up to this long within one run instead of leaving the next "
             "step to the next run (default: %(default)s)")
    add("--serving-validity", default="90d",
        help="life of a serving certificate (default: %(default)s)")
    add("--ca-validity", default="1095d", help="life of a CA (default: %(default)s)")
    add("--kubeconfig", help="kubeconfig file (default: in-cluster service account when run "
                             "in a pod, else $KUBECONFIG or ~/.kube/config)")
    add("--dry-run", action="store_true",
        help="read the cluster and log the steps that would be taken; write nothing")


def _duration(text: str, flag: str) -> timedelta:
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{flag}: {text!r} is not a duration; write e.g. 180, 90s, 5m, 12h or 90d")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def _check_lifetimes(propagation: timedelta, serving: timedelta, ca: timedelta) -> None:
    if serving <= timedelta(0) or ca <= timedelta(0):
        raise ValueError("--serving-validity and --ca-validity must be longer than zero")
    if serving > ca:
        raise ValueError("--serving-validity must not be longer than --ca-validity")
    # A renewal starts at 2/3 of the serving life; its steps must finish in the last third.
    if propagation * 3 >= serving / 3:
        raise ValueError("--propagation must be shorter than a ninth of --serving-validity, "
                         "or a rotation could not finish before the certificate expires")


def _default_namespace() -> str:
    try:
        return _SA_NAMESPACE.read_text().strip() or "vcuda-system"
    except OSError:
        return "vcuda-system"


def _api_client(kubeconfig: str | None) -> client.ApiClient:
    try:
        return api_client(kubeconfig)
    except CredentialsError as error:
        raise ClusterError(str(error)) from None
