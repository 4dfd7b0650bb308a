"""The ``vcuda-node`` command line: ``install``, ``uninstall`` and ``run``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime_hook.contract import (
    DEFAULT_DOMAINS,
    INVENTORY_NAME,
    ContractError,
    Sharing,
    check_domains,
    cores_scaling,
    max_sharers,
    memory_scaling,
    number_flag,
    version_flag,
)
from runtime_hook.hook_cli import DEFAULT_LIBRARY, DEFAULT_STATE_DIR
from runtime_hook.hook_errors import NodeError
from runtime_hook.node import cdi_files
from runtime_hook.node.dra import cdi
from runtime_hook.node.dra.plugin import DEFAULT_KUBELET_DIR
from runtime_hook.node.logs import LEVELS, event, setup
from runtime_hook.node.runtime_config import DEFAULT_PREFIX, NVIDIA_RUNTIMES, RUNTIMES

if TYPE_CHECKING:  # loaded by run --dra only
    from runtime_hook.node.dra.driver import DraSettings

DEFAULT_PORT = 9400

_DESCRIPTION = """\
The node agent of vcuda, run on each GPU node by the vcuda-node DaemonSet.

  install     put libvcuda.so and the OCI hook under PREFIX on the host, and give
              the container runtime (containerd or CRI-O) its vcuda handler
  uninstall   remove exactly what install wrote, and vcuda's resources and
              annotations from the node's Node object (--node-name)
  status      show what this node runs: the install and its runtime configuration,
              each GPU's committed and free memory and cores and its sharers, and
              each limited container's limits and use, with the fix for each problem
  run         keep the GPU inventory that the hook reads and the node's
              <domain>/vcuda-core and <domain>/vcuda-memory resources in step with
              the GPUs, and serve per-container GPU metrics for Prometheus

Paths are the node's; --host-root says where the node's root is mounted
(/host in the DaemonSet). Logs are JSON lines on stderr.
"""

_RUN_EPILOG = """\
metrics (http://ADDRESS:PORT/metrics), labels namespace, pod, container, node, gpu, uuid:
  vcuda_container_memory_limit_bytes, vcuda_container_memory_used_bytes,
  vcuda_container_core_limit_ratio, vcuda_container_core_used_ratio,
  vcuda_container_processes, vcuda_container_memory_driver_bytes,
  vcuda_container_unaccounted_processes; per GPU (node, gpu, uuid): vcuda_gpu_memory_total_bytes,
  vcuda_gpu_memory_used_bytes, vcuda_gpu_memory_limit_bytes, vcuda_gpu_core_used_ratio,
  vcuda_gpu_core_limit_ratio, vcuda_gpu_containers; vcuda_node_collect_errors_total,
  vcuda_node_refused_starts_total (node);
  with --dra, vcuda_dra_prepared_claims per GPU and vcuda_dra_claim_failures_total (node, call);
  vcuda_build_info (version).

example, on a GPU machine without Kubernetes (commands started by vcuda-run):
  vcuda-node run --no-advertise --vcuda-run-dir /tmp --port 9400
"""


_STATUS_EPILOG = """\
free is the GPU's memory, and 100% of its cores, less what is committed; the hook gives
a share only where both fit, times install's --memory-scaling and --cores-scaling.

examples:
  kubectl -n vcuda-system exec ds/vcuda-node -c agent -- vcuda-node status --host-root /host
  vcuda-node status --json | jq '.gpus[] | {uuid, memory_free, sharers}'
"""


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` (one of the contract's) as an argparse type: its ContractError is argparse's."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ContractError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _sharing_flags(parser: argparse.ArgumentParser, memory_help: str) -> None:
    """The node's settings for shared GPUs; install and run must be given the same values."""
    parser.add_argument("--memory-scaling", type=_argparse_type(memory_scaling), default=1.0,
                        metavar="X", help=memory_help)
    parser.add_argument("--cores-scaling", type=_argparse_type(cores_scaling), default=1.0,
                        metavar="S", help="the shares of one GPU's time may add up to 100 x S "
                        "percent, 1 to 10: overcommit, where busy containers split the GPU's "
                        "time (default: 1)")
    parser.add_argument("--max-sharers", type=_argparse_type(max_sharers), default=0,
                        metavar="K", help="the most limited containers (or DRA claims) on one "
                        "GPU, 0 for no cap (default: 0)")


def _sharing(args: argparse.Namespace) -> Sharing:
    return Sharing(args.memory_scaling, args.cores_scaling, args.max_sharers)


def _mib(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in MiB, 1..1024")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0..65535; 0: any free)")
    return int(text)


def _absolute(text: str) -> str:
    if not os.path.isabs(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an absolute path")
    return os.path.normpath(text)


def _common(parser: argparse.ArgumentParser, state_dir: bool = True) -> None:
    parser.add_argument("--host-root", type=_absolute, default="/", metavar="DIR",
                        help="where the node's root filesystem is mounted (default: /)")
    if state_dir:
        parser.add_argument("--state-dir", type=_absolute, default=DEFAULT_STATE_DIR,
                            metavar="DIR", help="the hook's state dir on the node: its ledger "
                            f"and the GPU inventory {INVENTORY_NAME} "
                            f"(default: {DEFAULT_STATE_DIR})")
    parser.add_argument("--log-level", choices=LEVELS, default="info")


def _node_flags(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"), metavar="NAME",
                        help=what)
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="credentials for --node-name (default: the pod's service account)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vcuda-node", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    restart: dict[str, Any] = {"action": argparse.BooleanOptionalAction, "default": True,
               "help": "restart the runtime (systemctl, on the node) when its vcuda handler "
                       "changed (default: yes)"}
    install = commands.add_parser("install", help="install the shim, the hook and the handler",
                                  description="Install, update, or finish an interrupted install. "
                                  "Idempotent: files already right are left alone.")
    _common(install)
    install.add_argument("--prefix", type=_absolute, default=DEFAULT_PREFIX, metavar="DIR",
                         help=f"where the shim and the hook go on the node (default: "
                              f"{DEFAULT_PREFIX})")
    install.add_argument("--runtime", choices=("auto", *RUNTIMES, "none"), default="auto",
                         help="the node's container runtime; auto: the one whose /etc "
                              "directory exists; none: only the shim and the hook")
    install.add_argument("--runtime-binary", type=_absolute, metavar="FILE",
                         help="NVIDIA's container runtime on the node, which the vcuda handler "
                              "runs (default: the first of " + ", ".join(NVIDIA_RUNTIMES) + ")")
    install.add_argument("--library", metavar="FILE",
                         help="libvcuda.so to install (default: this checkout's cshim build, "
                              "else the image's /usr/local/vcuda/lib/libvcuda.so)")
    install.add_argument("--node-config", metavar="DIR",
                         help="manifests/node, whose files configure the runtime (default: "
                              "this checkout's, else the image's /usr/local/share/vcuda/node)")
    _sharing_flags(install, "share of each GPU's memory the hook lets limited containers "
                   "commit; give run the same value, and the same --cores-scaling and "
                   "--max-sharers (default: 1)")
    install.add_argument("--restart-runtime", **restart)
    _node_flags(install, "record an Event on this Node when the install changed something "
                "(default: $NODE_NAME; neither: no Event)")

    uninstall = commands.add_parser("uninstall", help="remove what install wrote",
                                    description="Remove what install wrote, as its record "
                                    "PREFIX/installed.json lists, and nothing else.")
    _common(uninstall, state_dir=False)
    uninstall.add_argument("--prefix", type=_absolute, default=DEFAULT_PREFIX, metavar="DIR",
                           help=f"the install's prefix (default: {DEFAULT_PREFIX})")
    uninstall.add_argument("--restart-runtime", **restart)
    _node_flags(uninstall, "also take vcuda's resources and annotations off this Node, and "
                "record an Event on it (default: $NODE_NAME; neither: the files alone)")

    status = commands.add_parser(
        "status", help="show what this node runs", epilog=_STATUS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Show what vcuda runs on this node, read from the node itself (no "
        "Kubernetes): whether vcuda is installed under PREFIX and into which runtime "
        "configuration; each GPU (NVML's, else the hook's inventory) with the memory and "
        "cores its limited containers committed, what is free and who shares it; each "
        "limited container with its limits and its use (the hook's ledger, the shim's "
        "accounts, NVML); and each problem found with its fix. Exit status 0, or 2 when "
        "problems were found.")
    _common(status)
    status.add_argument("--prefix", type=_absolute, default=DEFAULT_PREFIX, metavar="DIR",
                        help=f"the install's prefix (default: {DEFAULT_PREFIX})")
    status.add_argument("--json", action="store_true",
                        help="print one JSON object instead of lines for a person")

    agent = commands.add_parser("run", help="advertise the GPUs and serve metrics",
                                description="Advertise the node's GPUs and serve metrics "
                                "until stopped (SIGTERM).", epilog=_RUN_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(agent)
    agent.add_argument("--node-name", default=os.environ.get("NODE_NAME"), metavar="NAME",
                       help="this node's name in Kubernetes (default: $NODE_NAME)")
    agent.add_argument("--domain", action="append", metavar="DOMAIN",
                       help="resource domain to advertise (default: the webhook's first, "
                            f"{DEFAULT_DOMAINS[0]}, to which it moves the others it accepts); "
                            "repeatable, but each domain gets every GPU: a node given two "
                            "can be filled twice")
    _sharing_flags(agent, "advertise each GPU's memory times X, as install gave the hook "
                   "(default: 1)")
    agent.add_argument("--address", default="0.0.0.0", help="metrics address (default: all)")
    agent.add_argument("--port", type=_port, default=DEFAULT_PORT,
                       help=f"metrics port (default: {DEFAULT_PORT})")
    agent.add_argument("--interval", type=number_flag("seconds", 1, low_allowed=True),
                       default=30.0, metavar="SECONDS",
                       help="how often the GPUs are read and the node checked (default: 30)")
    agent.add_argument("--vcuda-run-dir", action="append", default=[], type=_absolute,
                       metavar="DIR", help="also observe vcuda-run commands that keep their "
                       "files in DIR (their $TMPDIR, e.g. /tmp), repeatable")
    agent.add_argument("--advertise", action=argparse.BooleanOptionalAction, default=True,
                       help="patch the node's status (default: yes; --no-advertise: no "
                            "Kubernetes at all)")
    agent.add_argument("--kubeconfig", metavar="FILE",
                       help="credentials (default: the pod's service account)")
    agent.add_argument("--placement", action=argparse.BooleanOptionalAction, default=False,
                       help="take part in vcuda's per-GPU placement: publish the GPUs with a "
                            "heartbeat on the node (vcuda.io/gpus), serve the device plugin "
                            "of vcuda.io/shared-gpu and vcuda.io/gpu (which gives each "
                            "container the GPUs its pod was bound with), and prune the "
                            "node's GPU ledger (default: no; NVIDIA's device plugin then "
                            "hands out GPUs)")
    dra = agent.add_argument_group(
        "DRA (Kubernetes 1.34 or later; docs/DRA.md)",
        "With --dra the node's GPUs are offered as a ResourceSlice of driver vcuda.io "
        "(consumable cores and memory) instead of extended resources, and the agent is "
        "kubelet's plugin that prepares claims: limits file and CDI spec per claim.")
    dra.add_argument("--dra", action="store_true",
                     help="be a DRA driver on this node (default: no)")
    dra.add_argument("--kubelet-dir", type=_absolute, default=DEFAULT_KUBELET_DIR, metavar="DIR",
                     help=f"kubelet's root directory on the node (default: {DEFAULT_KUBELET_DIR})")
    dra.add_argument("--cdi-dir", type=_absolute, default=cdi_files.DEFAULT_DIR, metavar="DIR",
                     help="where the runtime reads transient CDI specs on the node "
                          f"(default: {cdi_files.DEFAULT_DIR})")
    dra.add_argument("--library", type=_absolute, default=DEFAULT_LIBRARY, metavar="FILE",
                     help=f"libvcuda.so on the node, as installed (default: {DEFAULT_LIBRARY})")
    dra.add_argument("--gpu-cdi-kind", default=cdi.NVIDIA_KIND, metavar="KIND",
                     help="CDI kind of NVIDIA's spec, whose devices are named by GPU UUID "
                          f"(nvidia-ctk cdi generate; default: {cdi.NVIDIA_KIND})")
    dra.add_argument("--account-mib", type=_mib, default=4, metavar="MIB",
                     help="size of each claim's /run/vcuda tmpfs (default: 4, as the hook)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``vcuda-node``; return its exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    log = setup(args.log_level)
    if args.command == "run":
        return _run(parser, args, log)
    if args.command == "status":
        return _status(args)
    from runtime_hook.node import install

    options = install.Options(
        host_root=args.host_root,
        prefix=args.prefix,
        state_dir=getattr(args, "state_dir", DEFAULT_STATE_DIR),
        runtime=getattr(args, "runtime", "none"),
        library=getattr(args, "library", None),
        node_config=getattr(args, "node_config", None),
        sharing=_sharing(args) if args.command == "install" else Sharing(),
        restart=args.restart_runtime,
        runtime_binary=getattr(args, "runtime_binary", None),
    )
    action = install.install if args.command == "install" else install.uninstall
    try:
        changed = action(options, log)
        if args.command == "uninstall" and args.node_name:
            _clean_node(args.node_name, args.kubeconfig, log)
        if changed and args.node_name:
            _tell_node(args, changed, log)
    except (install.InstallError, NodeError, OSError) as exc:
        event(log, logging.ERROR, f"{args.command}_failed", error=str(exc))
        print(f"vcuda-node {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


def _clean_node(node: str, kubeconfig: str | None, log: logging.Logger) -> None:
    from runtime_hook.node.advertise import NodeStatus
    from runtime_hook.node.node_cleanup import clean_node

    clean_node(NodeStatus(node, kubeconfig), log)


def _status(args: argparse.Namespace) -> int:
    import json

    from runtime_hook.node import status
    from runtime_hook.node.nvml import Nvml

    nvml = Nvml(host_root=args.host_root)
    try:
        found = status.gather(args.host_root, args.prefix, args.state_dir, nvml)
    finally:
        nvml.close()
    if args.json:
        print(json.dumps(status.as_json(found), indent=2))
    else:
        print(status.as_text(found), end="")
    return 2 if found.problems else 0


def _tell_node(args: argparse.Namespace, changed: list[str], log: logging.Logger) -> None:
    """Record on the Node what install or uninstall changed; a failure is logged alone."""
    from runtime_hook.node.advertise import AdvertiseError, NodeStatus
    from runtime_hook.node.kube_events import NORMAL, EventRecorder

    try:
        recorder = EventRecorder(NodeStatus(args.node_name, args.kubeconfig).client,
                                 args.node_name, log)
    except AdvertiseError as exc:
        event(log, logging.WARNING, "event_not_recorded", error=str(exc))
        return
    if args.command == "install":
        recorder.node_event(NORMAL, "VcudaInstalled", "Install",
                            f"vcuda installed under {args.prefix}; changed: " + ", ".join(changed))
    else:
        recorder.node_event(NORMAL, "VcudaUninstalled", "Uninstall",
                            f"vcuda removed from {args.prefix}; removed: " + ", ".join(changed))


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, log: logging.Logger) -> int:
    from runtime_hook.node import agent

    domains: tuple[str, ...] = ()
    if args.placement and not args.advertise:
        parser.error("run: --placement needs the node's API (drop --no-advertise)")
    if args.dra and not args.advertise:
        parser.error("run: --dra needs Kubernetes; leave out --no-advertise")
    if args.dra and args.placement:
        parser.error("run: --dra and --placement are two ways to place pods on GPUs; a node "
                     "takes one (docs/DRA.md)")
    if args.dra and os.path.basename(args.library) != "libvcuda.so":
        parser.error(f"run: --library {args.library}: the file must be named libvcuda.so "
                     "(its directory is mounted into containers)")
    if args.advertise:
        if not args.node_name:
            parser.error("run: --node-name (or $NODE_NAME) is needed to advertise; "
                         "--no-advertise runs without Kubernetes")
        try:
            domains = check_domains(tuple(args.domain)) if args.domain else DEFAULT_DOMAINS[:1]
        except ContractError as exc:
            parser.error(f"run: --domain: domains: {exc}")
    settings = agent.Settings(
        host_root=args.host_root,
        state_dir=args.state_dir,
        node=args.node_name or socket.gethostname(),
        domains=domains,
        sharing=_sharing(args),
        address=args.address,
        port=args.port,
        interval=args.interval,
        run_dirs=args.vcuda_run_dir,
        advertise=args.advertise,
        kubeconfig=args.kubeconfig,
        placement=args.placement,
        dra=_dra_settings(args) if args.dra else None,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        agent.run(settings, log, stop)
    except (OSError, RuntimeError) as exc:  # credentials, a port in use: one line to act on
        event(log, logging.ERROR, "run_failed", error=str(exc))
        print(f"vcuda-node run: {exc}", file=sys.stderr)
        return 1
    return 0


def _dra_settings(args: argparse.Namespace) -> DraSettings:
    from runtime_hook.node.dra.driver import DraSettings

    return DraSettings(kubelet_dir=args.kubelet_dir, cdi_dir=args.cdi_dir, library=args.library,
                       gpu_cdi_kind=args.gpu_cdi_kind, account_mib=args.account_mib)
