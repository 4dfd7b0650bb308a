"""`python -m demo`: the command line, and the demo's steps in order, cleaned up however it ends."""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from demo import gpu
from demo.commands import REPO, vcuda_command
from demo.machine import check_machine
from demo.node import (
    BUILT_LIBRARY,
    NODE_LIBRARY,
    RUNTIME_CLASS,
    Node,
    Runc,
    container_config,
    device_count,
    limits_problem,
    mounts_under,
    node_hooks,
    prepare_node,
    seen_lines,
    unmount,
    write_bundle,
)
from demo.pods import GIB, NAMESPACE, SAMPLES, SamplePod
from demo.reviews import (
    admitted_summary,
    limits_annotation,
    limits_text,
    review_lines,
    unexpected,
)
from demo.steps import OK, Done, Runner, StepFailed, StepSkipped
from runtime_hook.contract import Gpu, InventoryError, read_inventory

INTERRUPTED = 130
_DESCRIPTION = """\
The whole path of GPU pods on this machine, one step at a time: starts the
vcuda admission webhook on loopback (real TLS, a throwaway CA), sends it
sample pods as the API server would, starts each admitted container with real
runc and the vcuda hook wired as manifests/node wires it, and shows what the
container sees. On a machine with an NVIDIA GPU it then runs a CUDA program
under vcuda-run with the first pod's limits. Needs root (runc). Prints one
line per step; exits 1 if a step failed, 130 when interrupted. Everything it
starts or writes is removed at the end, also on Ctrl-C.

bash scripts/demo sets up .venv (scripts/setup) and runs the demo with it;
bash scripts/demo --python PYTHON skips the set-up and runs it with PYTHON,
which must have the webhook's modules (for a machine without a network).
"""


class Demo:
    """The demo's state across steps: the work directory, the webhook, reviews, the node."""

    def __init__(self, runner: Runner, work: Path, args: argparse.Namespace) -> None:
        self.runner = runner
        self.work = work
        self.args = args
        self.webhook: Any = None  # demo.admission.Webhook, imported once its modules are known
        self.reviews: dict[str, Any] = {}  # pod name to demo.admission.Review
        self.node: Node | None = None
        self.runc = Runc(work / "runc")
        self.gpu_ran = False

    def run(self) -> None:
        """Run every step; a step whose prerequisite failed is reported as not run."""
        run = self.runner.run
        machine = check_machine()
        facts = machine.facts
        problems = machine.admission_missing + machine.containers_missing
        run("check this machine", lambda: _checked(facts, problems))

        webhook_up = False
        if machine.admission_missing:
            self.runner.skip("start the admission webhook", "not run: see step 1")
        else:
            webhook_up = run("start the admission webhook", self._start_webhook)
        for sample in SAMPLES:
            title = f"review pod {NAMESPACE}/{sample.name} ({sample.about})"
            if webhook_up:
                run(title, functools.partial(self._review, sample))
            else:
                self.runner.skip(title, "not run: the webhook is not running")

        if machine.containers_missing:
            self.runner.skip("prepare the node", "not run: see step 1")
        elif not any(review.allowed for review in self.reviews.values()):
            self.runner.skip("prepare the node", "not run: no pod was admitted")
        else:
            run("prepare the node", functools.partial(self._prepare_node, machine.gpus.gpus))
        for sample in SAMPLES:
            review = self.reviews.get(sample.name)
            if review is None or not review.allowed:
                continue
            for container in review.pod["spec"]["containers"]:
                title = f"start container {NAMESPACE}/{sample.name}/{container['name']} with runc"
                if self.node is None:
                    self.runner.skip(title, "not run: the node is not prepared")
                else:
                    run(title, functools.partial(self._start_container, sample, review.pod,
                                                 container))

        title = "place a shared pod on a node with a full and a free GPU"
        if machine.admission_missing:
            self.runner.skip(title, "not run: see step 1")
        else:
            run(title, self._place)

        memory, cores = _gpu_limits()
        title = f"run a CUDA program under vcuda-run --memory {memory} --cores {cores}"
        if machine.gpus.gpus:
            run(title, functools.partial(self._cuda_program, memory, cores))
            self.gpu_ran = self.runner.statuses[-1] == OK
        else:
            self.runner.skip(title, f"no NVIDIA GPU here ({machine.gpus.why_none})")

    def clean_up(self) -> tuple[list[str], bool]:
        """Stop the webhook, delete containers left, remove the work dir.

        Returns what was done, and whether all of it worked.
        """
        said = []
        status = self.webhook.stop() if self.webhook is not None else None
        if status is not None:
            said.append(f"vcuda-webhook stopped (exit status {status})")
        left = self.runc.delete_all()
        said.append(f"deleted containers runc still held: {', '.join(left)}" if left
                    else "no container left")
        mounts = mounts_under(self.work)
        for point in reversed(mounts):
            unmount(point)
        if mounts:
            said.append(f"unmounted what was left: {', '.join(mounts)}")
        if self.args.keep:
            said.append(f"work files kept in {self.work}")
            return said, True
        try:
            shutil.rmtree(self.work)
        except OSError as exc:
            said.append(f"could not remove {self.work}: {exc}")
            return said, False
        said.append(f"{self.work} removed")
        return said, True

    # The steps: each returns Done or raises StepFailed / StepSkipped.

    def _start_webhook(self) -> Done:
        # demo.admission needs the webhook's modules: imported here, after step 1 found them,
        # so that a missing one is reported there rather than as a traceback.
        from demo.admission import Webhook, WebhookFailed

        self.webhook = Webhook(self.work)
        try:
            self.webhook.start()
        except WebhookFailed as exc:
            raise StepFailed(str(exc)) from None
        return Done(
            f"vcuda-webhook (pid {self.webhook.pid}) serves {self.webhook.url}/mutate with a "
            "throwaway CA's certificate; /readyz answered over verified TLS",
            ["$ " + " ".join(_shown(arg) for arg in self.webhook.command),
             f"CA:   {self.webhook.ca_file}", f"log:  {self.webhook.log_file} (JSON lines)"])

    def _review(self, sample: SamplePod) -> Done:
        from demo.admission import WebhookFailed

        try:
            review = self.webhook.review(sample.pod)
        except WebhookFailed as exc:
            raise StepFailed(str(exc)) from None
        self.reviews[sample.name] = review
        details = review_lines(sample.pod, review)
        wrong = unexpected(sample, review)
        if wrong:
            raise StepFailed(f"the webhook's answer is not the expected one: {wrong}", details)
        if not review.allowed:
            return Done("denied; the message says what to write instead", details)
        return Done(admitted_summary(sample), details)

    def _prepare_node(self, found: tuple[Gpu, ...]) -> Done:
        if self.args.inventory:
            gpus, origin = _read_inventory(self.args.inventory), f"from {self.args.inventory}"
        elif found:
            gpus, origin = found, "from nvidia-smi"
        else:
            gpus, origin = gpu.MADE_UP_GPUS, "made up: no NVIDIA GPU here"
        node = prepare_node(self.work, gpus)
        self.node = node
        placeholder = node.library != BUILT_LIBRARY
        return Done(
            f"the hook's state dir, GPU inventory ({origin}) and library"
            + (" (a placeholder: cshim is not built)" if placeholder else "") + " are ready",
            [f"state dir:      {node.state_dir}  (a node's /run/vcuda)",
             "GPU inventory:  " + ", ".join(f"{g.uuid} ({g.memory / GIB:.1f} GiB)"
                                            for g in node.gpus),
             f"library:        {_shown(node.library)}  (a node's {NODE_LIBRARY})",
             *(["                a placeholder file, as cshim/build/libvcuda.so is not built "
                "(make -C cshim): the hook only bind-mounts it, and busybox is static"]
               if placeholder else []),
             f"hook:           {_hook_command(node)}",
             "                (manifests/node/base-runtime-spec.json's prestart and poststop)"])

    def _start_container(self, sample: SamplePod, pod: dict[str, Any],
                         container: dict[str, Any]) -> Done:
        assert self.node is not None
        name = container["name"]
        devices = tuple(g.uuid for g in self.node.gpus[:device_count(container)])
        config = container_config(pod, container, self.node, devices)
        bundle = write_bundle(self.work / "bundles" / f"{sample.name}-{name}", config)
        seen, why_not = self.runc.run(bundle, f"{sample.name}-{name}")
        wanted = sample.limits.get(name, {}) if sample.limits else {}
        room = min((g.memory for g in self.node.gpus if g.uuid in devices), default=0)
        too_big = pod["spec"].get("runtimeClassName") == RUNTIME_CLASS and \
            wanted.get("memory", 0) > room
        if too_big:  # an --inventory with a small GPU: the hook must refuse the container
            if seen is not None:
                raise StepFailed(f"the container started, though its GPU has only "
                                 f"{room / GIB:.2f} GiB and it asks for "
                                 f"{wanted['memory'] / GIB:.2f} GiB")
            if not why_not.startswith("vcuda-hook: "):
                raise StepFailed(f"the container did not start, but not by the hook: {why_not}")
            return Done(f"refused by the hook, as it should be: its GPU has {room / GIB:.2f} GiB "
                        f"and it asks for {wanted['memory'] / GIB:.2f} GiB", [why_not])
        if seen is None:
            raise StepFailed(f"the container did not start: {why_not}")
        details = [f"device plugin's volume mounts: {','.join(devices) or 'none'}",
                   *seen_lines(seen)]
        limited = pod["spec"].get("runtimeClassName") == RUNTIME_CLASS
        if not limited:
            if seen != {"/etc/ld.so.preload": ["(absent)"], "/etc/vcuda/limits": ["(absent)"]}:
                raise StepFailed("a container outside runtime class vcuda got vcuda files",
                                 details)
            return Done("no runtime class vcuda (whole GPUs), so no hook: nothing added",
                        details)
        problem = limits_problem(seen, wanted, devices)
        if problem:
            raise StepFailed(problem, details)
        summary = (f"runtime class vcuda, so the hook ran: libvcuda.so preloaded, limits "
                   f"{limits_text(wanted)}, read-only")
        forged = limits_annotation(sample.pod).get(name)
        if forged and forged != wanted:
            summary += f" (not the forged {limits_text(forged)})"
        return Done(summary, details)

    def _place(self) -> Done:
        # Needs the extender's modules, which step 1 checked with the webhook's.
        from demo.placement import place_on_two_gpus

        return place_on_two_gpus(self.work)

    def _cuda_program(self, memory: str, cores: int) -> Done:
        probe = gpu.run_probe(self.args.cuda_python, memory, cores)
        command = " ".join([_shown(probe.command[0]), *probe.command[1:]])
        details = ["(the demo's containers have no GPU driver inside, as no NVIDIA container "
                   "runtime starts them, so vcuda-run puts the same limits on a process here)",
                   f"$ {command}", *probe.lines]
        if gpu.lacks_cuda_library(probe):
            raise StepSkipped(f"{self.args.cuda_python} has neither torch nor cupy; name one "
                              "that has with --cuda-python")
        result = probe.result
        if probe.exit_status != 0 or result is None:
            raise StepFailed(f"the program failed (exit status {probe.exit_status})", details)
        wanted = _gpu_memory_bytes(memory)
        if result["total"] != wanted:
            raise StepFailed(f"{result['library']} saw {result['total'] / GIB:.2f} GiB in all, "
                             f"not {wanted / GIB:.2f} GiB: the limit did not apply", details)
        if not result["out_of_memory"]:
            raise StepFailed("an allocation past the limit succeeded", details)
        return Done(f"{result['library']} sees {result['total'] / GIB:.2f} GiB in all, and an "
                    "allocation past it fails with a clean out-of-memory error", details)


def _hook_command(node: Node) -> str:
    """The prestart hook's command line, with paths in the checkout shortened."""
    hook = node_hooks(node)["prestart"][0]
    return " ".join(_shown(arg) for arg in [hook["path"], *hook["args"][1:]])


def _read_inventory(path: Path) -> tuple[Gpu, ...]:
    try:
        gpus = read_inventory(str(path))
    except InventoryError as exc:
        raise StepFailed(f"--inventory: {exc}") from None
    if gpus is None:
        raise StepFailed(f"--inventory {path}: no such file")
    return tuple(sorted(gpus.values(), key=lambda g: g.index))


def _checked(facts: list[str], problems: list[str]) -> Done:
    if problems:
        raise StepFailed(problems[0] + (f" (and {len(problems) - 1} more below)"
                                        if len(problems) > 1 else ""), [*facts, *problems[1:]])
    return Done("everything the demo needs is here", facts)


def _gpu_limits() -> tuple[str, int]:
    """The first sample pod's limits, as vcuda-run flags: ("10Gi", 30)."""
    (limits,) = (SAMPLES[0].limits or {}).values()
    return f"{limits['memory'] // GIB}Gi", limits["cores"]


def _gpu_memory_bytes(memory: str) -> int:
    return int(memory.removesuffix("Gi")) * GIB


def _shown(path: str | Path) -> str:
    """A path as the output shows it: relative to the checkout when inside it."""
    try:
        return str(Path(path).relative_to(REPO))
    except ValueError:
        return str(path)


def _try_next(runner: Runner, gpu_ran: bool) -> str:
    if runner.failed:
        return "Fix what the FAILED lines say, then run it again: bash scripts/demo"
    if gpu_ran:
        run = " ".join(_shown(part) for part in vcuda_command("vcuda-run", "runtime_hook.run"))
        return (f"Try next: limit a program of yours the same way: {run} --memory 4Gi "
                "--cores 30 -- python3 your_script.py (nvidia-smi under it shows 4 GiB too)")
    return ("Try next: on a machine with an NVIDIA GPU, bash scripts/demo also runs a CUDA "
            "program under these limits; to deploy vcuda on a cluster, see README.md, "
            "\"Install\"")


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold off Ctrl-C and SIGTERM while cleaning up, so that cleaning is never cut short."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bash scripts/demo", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuda-python", default="python3", metavar="PYTHON",
                        help="Python with torch or cupy for the CUDA step (default: python3)")
    parser.add_argument("--inventory", type=Path, metavar="FILE",
                        help="GPU inventory for the hook (format in runtime_hook/contract.py)"
                             " instead of one from nvidia-smi, or a made-up one without a GPU; "
                             "e.g. a 4 GiB GPU, to see the hook refuse a 10 GiB container")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work files (bundles, logs, certificates) for a look; "
                             "processes and containers are stopped all the same")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0, 1 when a step failed, or 130 when interrupted."""
    args = _parser().parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    runner = Runner(sys.stdout)
    work = Path(tempfile.mkdtemp(prefix="vcuda-demo-"))
    demo = Demo(runner, work, args)
    interrupted = False
    try:
        runner.print("vcuda demo: GPU pods on this machine, from admission to a process held to "
                     "its limits.")
        runner.print("It starts the webhook, sends it pods as the API server would, starts the "
                     "admitted containers")
        runner.print("with runc and vcuda's hook, and, with an NVIDIA GPU, runs a CUDA program "
                     "under the limits.")
        runner.print(f"Work files: {work} ("
                     + ("kept: --keep" if args.keep else "removed at the end") + ").")
        runner.print()
        demo.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:  # also after an error of the demo itself: nothing it started may outlive it
        with _signals_blocked():
            said, clean = demo.clean_up()
    runner.print()
    runner.print(("Cleaned up: " if clean else "Clean-up FAILED: ") + "; ".join(said) + ".")
    if interrupted:
        runner.print(f"Interrupted after {len(runner.statuses)} steps.")
        return INTERRUPTED
    runner.print(runner.tally() + ".")
    runner.print(_try_next(runner, demo.gpu_ran))
    return 1 if runner.failed or not clean else 0
