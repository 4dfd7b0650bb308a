"""Each package's errors descend from its one root, which carries what went wrong and the fix."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import demo
import extender
import runtime_hook
import webhook
from demo.steps import DemoError
from extender.errors import ExtenderError
from runtime_hook.contract import ContractError, InventoryError, VcudaError
from runtime_hook.hook_errors import HookError, NodeError
from webhook.errors import WebhookError

# The contract's errors are the contract's, shared by every package.
ROOTS = {
    "runtime_hook": (NodeError, ContractError),
    "webhook": (WebhookError,),
    "demo": (DemoError,),
    "extender": (ExtenderError,),
}


def _errors() -> list[type[BaseException]]:
    found = set()
    for package in (runtime_hook, webhook, extender, demo):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.endswith("__main__"):
                continue  # runs the command
            module = importlib.import_module(info.name)
            found |= {
                cls for _, cls in inspect.getmembers(module, inspect.isclass)
                if issubclass(cls, BaseException) and cls.__module__ == info.name
            }
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


ERRORS = _errors()


def test_the_search_finds_the_errors_of_every_package() -> None:
    assert {HookError, InventoryError, WebhookError, ExtenderError, DemoError} <= set(ERRORS)


@pytest.mark.parametrize("error", ERRORS, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_error_descends_from_its_packages_root(error: type[BaseException]) -> None:
    assert error is VcudaError or issubclass(error, ROOTS[error.__module__.split(".")[0]])


def test_no_two_errors_share_a_name() -> None:
    names = [cls.__qualname__ for cls in ERRORS]
    assert sorted(names) == sorted(set(names))


def test_an_error_carries_its_message_and_a_fix_that_a_raise_may_override() -> None:
    assert (str(InventoryError("gone")), InventoryError("gone").fix) == (
        "gone", "restart the node agent: it rewrites the inventory")
    assert InventoryError("gone", "do this").fix == "do this"
    assert issubclass(InventoryError, ValueError)  # still caught where bad input is
    assert VcudaError("x").fix == ""
