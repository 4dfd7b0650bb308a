"""`python -m demo`: the command line, and the demo's steps in order, cleaned up however it ends."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
import signal
import subprocess
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
    RUNTIME_CLASS,
    Node,
    Runc,
    container_config,
    device_count,
    node_hooks,
    prepare_node,
    write_bundle,
)
from demo.pods import GIB, LIMITS_ANNOTATION, NAMESPACE, SAMPLES, SamplePod
from demo.steps import Done, Runner, StepFailed, StepSkipped

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
            gpus = machine.gpus.gpus
            run("prepare the node", functools.partial(self._prepare_node, gpus, bool(gpus)))
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

        memory, cores = _gpu_limits()
        title = f"run a CUDA program under vcuda-run --memory {memory} --cores {cores}"
        if machine.gpus.gpus:
            self.gpu_ran = run(title, functools.partial(self._cuda_program, memory, cores))
        else:
            self.runner.skip(title, f"no NVIDIA GPU here ({machine.gpus.why_none})")

    def clean_up(self) -> list[str]:
        """Stop the webhook, delete containers left, remove the work dir; say what was done."""
        said = []
        if self.webhook is not None:
            status = self.webhook.stop()
            said.append(f"vcuda-webhook stopped (exit status {status})")
        left = self.runc.delete_all()
        said.append(f"deleted containers runc still held: {', '.join(left)}" if left
                    else "no container left")
        mounts = _mounts_under(self.work)
        for point in reversed(mounts):
            _unmount(point)
        if mounts:
            said.append(f"unmounted what was left: {', '.join(mounts)}")
        if self.args.keep:
            said.append(f"work files kept in {self.work}")
        else:
            shutil.rmtree(self.work)
            said.append(f"{self.work} removed")
        return said

    # The steps: each returns Done or raises StepFailed / StepSkipped.

    def _start_webhook(self) -> Done:
        from demo.admission import Webhook, WebhookError

        self.webhook = Webhook(self.work)
        try:
            self.webhook.start()
        except WebhookError as exc:
            raise StepFailed(str(exc)) from None
        return Done(
            f"{_shown(self.webhook.command[0])} (pid {self.webhook.pid}) serves "
            f"{self.webhook.url}/mutate with a throwaway CA's certificate; /readyz answered "
            "over verified TLS",
            [f"CA:   {self.webhook.ca_file}", f"log:  {self.webhook.log_file} (JSON lines)"])

    def _review(self, sample: SamplePod) -> Done:
        from demo.admission import WebhookError

        try:
            review = self.webhook.review(sample.pod)
        except WebhookError as exc:
            raise StepFailed(str(exc)) from None
        self.reviews[sample.name] = review
        details = _review_details(sample.pod, review)
        wrong = _unexpected(sample, review)
        if wrong:
            raise StepFailed(f"the webhook's answer is not the expected one: {wrong}", details)
        if not review.allowed:
            return Done("denied; the message says what to write instead", details)
        return Done(_admitted_summary(sample), details)

    def _prepare_node(self, gpus: tuple[Any, ...], real: bool) -> Done:
        node = prepare_node(self.work, gpus or gpu.MADE_UP_GPUS)
        self.node = node
        inventory = ", ".join(f"{g.uuid} ({g.memory / GIB:.1f} GiB)" for g in node.gpus)
        library = _shown(node.library)
        hook = _hook_command(node)
        return Done(
            "the hook's state dir, GPU inventory"
            + ("" if real else " (made up: no NVIDIA GPU here)") + " and library are ready",
            [f"state dir:      {node.state_dir}  (a node's /run/vcuda)",
             f"GPU inventory:  {inventory}" + ("" if real else "  (made up)"),
             f"library:        {library}  (a node's /usr/local/vcuda/lib/libvcuda.so)"
             + ("" if node.library.is_relative_to(REPO)
                else "  (a placeholder file: cshim/build/libvcuda.so is not built; the hook "
                     "only bind-mounts it, and busybox is static)"),
             f"hook:           {hook}",
             "                (manifests/node/base-runtime-spec.json's prestart and poststop)"])

    def _start_container(self, sample: SamplePod, pod: dict[str, Any],
                         container: dict[str, Any]) -> Done:
        assert self.node is not None
        name = container["name"]
        devices = tuple(g.uuid for g in self.node.gpus[:device_count(container)])
        config = container_config(pod, container, self.node, devices)
        bundle = write_bundle(self.work / "bundles" / f"{sample.name}-{name}", config)
        seen, why_not = self.runc.run(bundle, f"{sample.name}-{name}")
        if seen is None:
            raise StepFailed(f"the container did not start: {why_not}")
        details = [f"NVIDIA_VISIBLE_DEVICES={','.join(devices)}  (what the device plugin sets)",
                   *_inside_details(seen)]
        limited = pod["spec"].get("runtimeClassName") == RUNTIME_CLASS
        if not limited:
            if seen != {"/etc/ld.so.preload": ["(absent)"], "/etc/vcuda/limits": ["(absent)"]}:
                raise StepFailed("a container outside runtime class vcuda got vcuda files",
                                 details)
            return Done("no runtime class vcuda (whole GPUs), so no hook: nothing added",
                        details)
        wanted = sample.limits[name] if sample.limits else {}
        problem = _limits_problem(seen, wanted, devices)
        if problem:
            raise StepFailed(problem, details)
        summary = (f"runtime class vcuda, so the hook ran: libvcuda.so preloaded, limits "
                   f"{_limits_text(wanted)}, read-only")
        forged = _annotation(sample.pod).get(name)
        if forged and forged != wanted:
            summary += f" (not the forged {_limits_text(forged)})"
        return Done(summary, details)

    def _cuda_program(self, memory: str, cores: int) -> Done:
        probe = gpu.run_probe(self.args.cuda_python, memory, cores)
        command = " ".join([_shown(probe.command[0]), *probe.command[1:]])
        details = [f"$ {command}", *probe.lines,
                   "(the demo's containers have no GPU driver inside, as no NVIDIA container "
                   "runtime runs them here, so vcuda-run puts the same limits on a process of "
                   "this machine)"]
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


def _checked(facts: list[str], problems: list[str]) -> Done:
    if problems:
        raise StepFailed(problems[0] + (f" (and {len(problems) - 1} more below)"
                                        if len(problems) > 1 else ""), [*facts, *problems[1:]])
    return Done("everything the demo needs is here", facts)


def _gpu_limits() -> tuple[str, int]:
    """The first sample pod's limits, as vcuda-run flags: ("10Gi", 30)."""
    limits = next(iter(SAMPLES[0].limits.values()))  # type: ignore[union-attr]
    return f"{limits['memory'] // GIB}Gi", limits["cores"]


def _gpu_memory_bytes(memory: str) -> int:
    return int(memory.removesuffix("Gi")) * GIB


def _annotation(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's vcuda.io/limits, parsed; {} when absent."""
    value = (pod["metadata"].get("annotations") or {}).get(LIMITS_ANNOTATION)
    return json.loads(value) if value else {}


def _limits_text(limits: dict[str, int]) -> str:
    return f"{limits['cores']}% / {limits['memory'] / GIB:g} GiB"


def _resources_text(container: dict[str, Any]) -> str:
    limits = container.get("resources", {}).get("limits", {})
    return ", ".join(f"{key}: {value}" for key, value in limits.items())


def _review_details(asked: dict[str, Any], review: Any) -> list[str]:
    lines = [f"asks:     {c['name']}: {_resources_text(c)}" for c in asked["spec"]["containers"]]
    written = (asked["metadata"].get("annotations") or {}).get(LIMITS_ANNOTATION)
    if written:
        lines.append(f"          and writes {LIMITS_ANNOTATION}: {written}")
    if not review.allowed:
        return [*lines, f"message:  {review.message}"]
    lines += [f"warning:  {warning}" for warning in review.warnings]
    for number, op in enumerate(review.patch):
        value = f" {json.dumps(op['value'])}" if "value" in op else ""
        lines.append(f"{'patch:' if number == 0 else '':<10}{op['op']} {op['path']}{value}")
    pod = review.pod
    lines += [f"{'patched:' if number == 0 else '':<10}{c['name']}: {_resources_text(c)}"
              for number, c in enumerate(pod["spec"]["containers"])]
    value = (pod["metadata"].get("annotations") or {}).get(LIMITS_ANNOTATION)
    lines.append(f"          {LIMITS_ANNOTATION}: {value or '(none)'}")
    lines.append(f"          runtimeClassName: {pod['spec'].get('runtimeClassName') or '(none)'}")
    return lines


def _unexpected(sample: SamplePod, review: Any) -> str:
    """What in the review differs from the sample's expectations; '' when nothing."""
    if review.allowed != sample.allowed:
        return f"{'admitted' if review.allowed else 'denied'}, expected the opposite"
    if not review.allowed:
        return "" if review.message else "denied without a message"
    if _annotation(review.pod) != (sample.limits or {}):
        return f"{LIMITS_ANNOTATION} is {_annotation(review.pod)}, expected {sample.limits}"
    if review.pod["spec"].get("runtimeClassName") != sample.runtime_class:
        return f"runtimeClassName is {review.pod['spec'].get('runtimeClassName')!r}"
    containers = {c["name"]: c for c in review.pod["spec"]["containers"]}
    for name, wanted in sample.resources.items():
        limits = containers[name].get("resources", {}).get("limits", {})
        for key, value in wanted.items():
            if limits.get(key) != value:
                return f"{name}'s limits have {key}: {limits.get(key)}, expected {value}"
    return ""


def _admitted_summary(sample: SamplePod) -> str:
    adds = [f"{key}: {value}" for wanted in sample.resources.values()
            for key, value in wanted.items()]
    if sample.limits:
        adds.append(LIMITS_ANNOTATION)
    if sample.runtime_class:
        adds.append(f"runtime class {sample.runtime_class}")
    summary = "admitted; the patch adds " + ", ".join(adds[:-1]) + " and " * (len(adds) > 1) \
        + adds[-1]
    if _annotation(sample.pod):
        summary += ", replacing the forged annotation"
    return summary


def _inside_details(seen: dict[str, list[str]]) -> list[str]:
    lines = []
    for name, label in (("/etc/ld.so.preload", "/etc/ld.so.preload:"),
                        ("/etc/vcuda/limits", "/etc/vcuda/limits:"),
                        ("raise", "raising its limits:")):
        for number, line in enumerate(seen.get(name, ())):
            lines.append(f"{label if number == 0 else '':<22}{line}")
    return lines


def _limits_problem(seen: dict[str, list[str]], wanted: dict[str, int],
                    devices: tuple[str, ...]) -> str:
    from runtime_hook.limits_file import Limits, LimitsFormatError, parse

    preload = seen.get("/etc/ld.so.preload", [])
    if not preload or preload[0] != "/usr/local/vcuda/lib/libvcuda.so":
        return "/etc/ld.so.preload does not load libvcuda.so first"
    try:
        limits = parse("\n".join(seen.get("/etc/vcuda/limits", [])) + "\n")
    except LimitsFormatError as exc:
        return f"/etc/vcuda/limits is not a valid limits file: {exc}"
    expected = Limits(memory=wanted["memory"], cores=wanted["cores"], devices=devices,
                      account="/run/vcuda/account")
    if limits != expected:
        return f"/etc/vcuda/limits holds {limits}, expected {expected}"
    if not any("Read-only" in line for line in seen.get("raise", [])):
        return "the container could write /etc/vcuda/limits"
    return ""


def _shown(path: str | Path) -> str:
    """A path as the output shows it: relative to the checkout when inside it."""
    try:
        return str(Path(path).relative_to(REPO))
    except ValueError:
        return str(path)


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        points = [line.split()[4] for line in table]
    prefix = str(path) + "/"
    return sorted(p for p in points if p.startswith(prefix))


def _unmount(point: str) -> None:
    subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)


def _try_next(runner: Runner, gpu_ran: bool) -> str:
    if runner.failed:
        return "Fix what the FAILED lines say, then run it again: bash scripts/demo"
    if gpu_ran:
        run = " ".join(_shown(part) for part in vcuda_command("vcuda-run", "runtime_hook.run"))
        return (f"Try next: limit a program of yours the same way: {run} --memory 4Gi "
                "--cores 30 -- python3 your_script.py (nvidia-smi under it shows 4 GiB too)")
    return ("Try next: on a machine with an NVIDIA GPU, bash scripts/demo also runs a CUDA "
            "program under these limits; to deploy vcuda on a cluster, see README.md, "
            "\"Deploying\"")


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
    runner.print("vcuda demo: GPU pods on this machine, from admission to a process held to "
                 "its limits.")
    runner.print("It starts the webhook, sends it pods as the API server would, starts the "
                 "admitted containers")
    runner.print("with runc and vcuda's hook, and, with an NVIDIA GPU, runs a CUDA program "
                 "under the limits.")
    runner.print(f"Work files: {work} (removed at the end).")
    runner.print()
    demo = Demo(runner, work, args)
    interrupted = False
    try:
        demo.run()
    except KeyboardInterrupt:
        interrupted = True
    with _signals_blocked():
        said = demo.clean_up()
    runner.print()
    runner.print("Cleaned up: " + "; ".join(said) + ".")
    if interrupted:
        runner.print(f"Interrupted after {len(runner.statuses)} steps.")
        return INTERRUPTED
    runner.print(runner.tally() + ".")
    runner.print(_try_next(runner, demo.gpu_ran))
    return 1 if runner.failed else 0
