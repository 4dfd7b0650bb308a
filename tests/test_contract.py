"""The contract between components: names, the limits annotation, the limits file, domains."""

from __future__ import annotations

import argparse
import re

import pytest

from runtime_hook import oci_hook
from runtime_hook.contract import (
    ANNOTATION_DOMAIN,
    LIMITS_ANNOTATION,
    ContractError,
    Limits,
    LimitsFormatError,
    Sharing,
    check_domains,
    container_limits,
    cores_scaling,
    is_dns_subdomain,
    max_sharers,
    memory_scaling,
    number_flag,
    parse_limits,
    positive_seconds,
    render_limits,
    render_limits_annotation,
)

GIB = 1 << 30


def test_the_annotation_the_webhook_renders_is_what_the_hook_reads() -> None:
    table = {"b": {"cores": 99, "memory": 1}, "a": {"cores": 30, "memory": 10 * GIB}}
    value = render_limits_annotation(table)
    assert value == '{"a":{"cores":30,"memory":10737418240},"b":{"cores":99,"memory":1}}'
    assert container_limits(value, "a") == (30, 10 * GIB)
    assert container_limits(value, "b") == (99, 1)
    assert container_limits(value, "c") is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "is not a JSON object"),
        ('{"a": 30}', "entry for 'a' is not an object"),
        ('{"a": {"cores": 100, "memory": 1}}',
         "cores of 'a' is 100, expected a whole number 1..99"),
        ('{"a": {"cores": 0, "memory": 1}}',
         "cores of 'a' is 0, expected a whole number 1..99"),
        ('{"a": {"cores": true, "memory": 1}}', "cores of 'a' is True"),
        ('{"a": {"cores": 30}}', "memory of 'a' is None, expected a whole number at least 1"),
        ('{"a": {"cores": 30, "memory": 1.5}}', "memory of 'a' is 1.5"),
    ],
)
def test_a_broken_annotation_entry_is_refused_with_what_is_wrong(value: str, message: str) -> None:
    wanted = f"annotation {re.escape(LIMITS_ANNOTATION)}.*{re.escape(message)}"
    with pytest.raises(ContractError, match=wanted):
        container_limits(value, "a")


def test_the_hooks_shortcut_looks_for_the_annotation_domain() -> None:
    # oci_hook tests the raw state for this before it imports anything, the contract included.
    assert oci_hook.surely_unlimited(b'{"annotations":{"other.io/x":"1"}}')
    mentioned = f'{{"annotations":{{"{ANNOTATION_DOMAIN}/x":"1"}}}}'
    assert not oci_hook.surely_unlimited(mentioned.encode())


@pytest.mark.parametrize("name", ["docker.com", "tencent.com", "a", "a-b.c0", "vcuda"])
def test_dns_names_are_accepted(name: str) -> None:
    assert is_dns_subdomain(name)


@pytest.mark.parametrize(
    "name", ["", "Docker.com", "docker_com", "-a.com", "a-.com", "a..com", ".a"]
)
def test_names_that_are_not_dns_names_are_refused(name: str) -> None:
    assert not is_dns_subdomain(name)


@pytest.mark.parametrize(
    ("domains", "message"),
    [
        ((), "give at least one resource domain"),
        (("docker.com", "Docker_Com"), "'Docker_Com' is not a DNS name like 'docker.com'"),
        (("docker.com", "docker.com"), "a domain is listed twice"),
    ],
)
def test_bad_domains_are_refused_with_a_message(domains: tuple[str, ...], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        check_domains(domains)


@pytest.mark.parametrize(
    ("text", "value"), [("1", 1.0), ("1.5", 1.5), ("100", 100.0), ("0.25", 0.25)]
)
def test_memory_scaling_takes_a_number_in_0_to_100(text: str, value: float) -> None:
    assert memory_scaling(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "100.5", "lots", "", "nan"])
def test_memory_scaling_outside_0_to_100_is_refused(text: str) -> None:
    with pytest.raises(ContractError, match=f"{text!r} is not a number in \\(0, 100\\], e.g. 1.5"):
        memory_scaling(text)


@pytest.mark.parametrize(("text", "value"), [("1", 1.0), ("1.2", 1.2), ("10", 10.0)])
def test_cores_scaling_takes_a_number_in_1_to_10(text: str, value: float) -> None:
    assert cores_scaling(text) == value


@pytest.mark.parametrize("text", ["0.5", "0", "10.5", "lots", "", "nan", "inf"])
def test_cores_scaling_outside_1_to_10_is_refused(text: str) -> None:
    with pytest.raises(ContractError, match=f"{text!r} is not a number in \\[1, 10\\], e.g. 1.5"):
        cores_scaling(text)


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("10", 10), ("1000", 1000)])
def test_max_sharers_takes_a_whole_number_up_to_1000(text: str, value: int) -> None:
    assert max_sharers(text) == value


@pytest.mark.parametrize("text", ["-1", "1001", "2.5", "ten", "", " 3", "٣"])
def test_max_sharers_that_is_no_whole_number_up_to_1000_is_refused(text: str) -> None:
    with pytest.raises(ContractError, match=r"is not a whole number in 0..1000 \(0: no cap\)"):
        max_sharers(text)


def test_sharing_gives_the_scaled_capacities_and_only_the_flags_that_differ() -> None:
    assert Sharing().flags() == []
    assert (Sharing().memory(80 * 2**30), Sharing().cores()) == (80 * 2**30, 100)
    sharing = Sharing(1.5, 1.2, 10)
    assert (sharing.memory(2**30), sharing.cores()) == (3 * 2**29, 120)
    assert sharing.flags() == ["--memory-scaling", "1.5", "--cores-scaling", "1.2",
                               "--max-sharers", "10"]


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "0", "-1", "", "x"])
def test_a_duration_flag_refuses_what_is_not_a_finite_number_above_0(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError,
                       match=f"^{re.escape(repr(text))} is not a number of seconds more than 0$"):
        positive_seconds(text)


def test_a_number_flag_takes_finite_numbers_from_its_bound_when_allowed() -> None:
    warmup = number_flag("seconds", 0, low_allowed=True)
    assert (warmup("0"), warmup("1.5"), positive_seconds("1e-3")) == (0.0, 1.5, 0.001)
    for text in ("nan", "inf", "-0.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a number of seconds, at least 0"):
            warmup(text)


def test_render_then_parse_gives_back_the_same_limits() -> None:
    limits = Limits(memory=10 << 30, cores=30, devices=("GPU-a", "GPU-b"), account="/run/a")
    assert parse_limits(render_limits(limits)) == limits


def test_render_lists_every_key_once_in_key_value_lines() -> None:
    text = render_limits(Limits(memory=1024, cores=5))
    assert text == "version=1\nmemory=1024\ncores=5\ndevices=\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memory=1\n", "version must be 1"),
        ("version=1\n", "memory is missing"),
        ("version=1\nmemory=lots\n", "whole numbers"),
        ("version=1\nmemory=1\nmemory=2\n", "given twice"),
        ("version=1\nmemory=0\n", "positive"),
        ("version=1\nmemory=1\ncores=150\n", "1..100"),
        ("version=1\nnonsense\n", "key=value"),
    ],
)
def test_parse_rejects_bad_files_with_a_message(text: str, message: str) -> None:
    with pytest.raises(LimitsFormatError, match=message):
        parse_limits(text)


def test_device_uuid_with_a_separator_is_refused() -> None:
    with pytest.raises(LimitsFormatError, match="not allowed"):
        Limits(memory=1, devices=("GPU-a,GPU-b",))
