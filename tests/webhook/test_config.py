"""The policy settings: defaults, a JSON file, and clear errors for bad ones."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest

from webhook.config import Config, ConfigError, config_from_mapping, load_config


def test_defaults_follow_the_architecture() -> None:
    config = Config()
    assert config.domains == ("docker.com", "tencent.com")
    assert config.shared_resource == "nvidia.com/gpu.shared"
    assert config.exclusive_resource == "nvidia.com/gpu"
    assert config.runtime_class == "vcuda"
    assert config.max_gpu_memory == 80 << 30
    assert config.max_gpu_memory_from_nodes is True  # where the server can read the Nodes


def test_a_file_sets_every_key(tmp_path: Path) -> None:
    path = tmp_path / "vcuda.json"
    path.write_text('{"domains": ["example.org"], "shared_resource": "example.org/gpu-share",'
                    ' "exclusive_resource": "example.org/gpu", "runtime_class": "limited",'
                    ' "max_gpu_memory": "141Gi", "deny_direct_shared": true}')
    assert load_config(path) == Config(
        domains=("example.org",), shared_resource="example.org/gpu-share",
        exclusive_resource="example.org/gpu", runtime_class="limited",
        max_gpu_memory=141 << 30, max_gpu_memory_from_nodes=False)


def test_every_setting_can_be_given_in_a_file() -> None:
    defaults = Config()
    values = {f.name: getattr(defaults, f.name) for f in fields(Config)
              if f.name != "max_gpu_memory_from_nodes"}  # follows from max_gpu_memory
    values["domains"] = list(values["domains"])
    values["trusted_seccomp_profiles"] = ["profiles/gpu.json"]
    assert config_from_mapping(values) == replace(
        defaults, max_gpu_memory_from_nodes=False, trusted_seccomp_profiles=("profiles/gpu.json",))


def test_max_gpu_memory_in_a_file_wins_over_what_the_nodes_publish() -> None:
    assert config_from_mapping({}).max_gpu_memory_from_nodes is True
    assert config_from_mapping({"max_gpu_memory": "80Gi"}).max_gpu_memory_from_nodes is False
    with pytest.raises(ConfigError, match="unknown key 'max_gpu_memory_from_nodes'"):
        config_from_mapping({"max_gpu_memory_from_nodes": False})


def test_keys_left_out_keep_their_defaults() -> None:
    assert config_from_mapping({"runtime_class": "other"}) == Config(runtime_class="other")


def test_max_gpu_memory_may_be_bytes() -> None:
    assert config_from_mapping({"max_gpu_memory": 1 << 34}).max_gpu_memory == 1 << 34


@pytest.mark.parametrize(("values", "message"), [
    ({"domain": ["docker.com"]}, "unknown key 'domain'; known keys: domains, "),
    ({"domains": "docker.com"}, "domains: expected a list of domain names"),
    ({"domains": []}, "domains: give at least one resource domain"),
    ({"domains": ["Docker.COM"]}, "domains: 'Docker.COM' is not a DNS name"),
    ({"domains": ["a.io", "a.io"]}, "domains: a domain is listed twice"),
    ({"shared_resource": "gpu"}, "shared_resource: 'gpu' is not a resource name"),
    ({"exclusive_resource": 1}, "exclusive_resource: expected a resource name, got 1"),
    ({"shared_resource": "nvidia.com/gpu"}, "shared_resource and exclusive_resource must differ"),
    ({"runtime_class": "Not Valid"}, "runtime_class: 'Not Valid' is not a RuntimeClass name"),
    ({"max_gpu_memory": "lots"}, "max_gpu_memory: expected a quantity"),
    ({"max_gpu_memory": "100Mi"}, "max_gpu_memory: must be at least 256Mi"),
    ({"deny_direct_shared": "yes"}, "deny_direct_shared: expected true (a shared GPU asked for "
                                    "directly has no limits), got 'yes'"),
    ({"deny_direct_shared": False}, "deny_direct_shared: false is no longer allowed: a container "
                                    "that asks for a shared GPU's resource itself would run "
                                    "without limits; remove the key"),
    ({"trusted_seccomp_profiles": "gpu.json"},
     "trusted_seccomp_profiles: expected a list of localhostProfile names"),
    ({"trusted_seccomp_profiles": [""]},
     "trusted_seccomp_profiles: expected a list of localhostProfile names"),
    (["docker.com"], "the configuration must be a JSON object"),
])
def test_bad_settings_name_the_key_and_what_is_allowed(values: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(values)
    assert message in str(caught.value)


def test_a_file_that_is_not_json_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "vcuda.json"
    path.write_text("domains = ['docker.com']")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: not JSON: it goes wrong at character 0"


def test_a_missing_file_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.json: No such file or directory"):
        load_config(tmp_path / "missing.json")
