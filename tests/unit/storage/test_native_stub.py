"""``storage/_native.pyi`` against the extension module it describes.

mypy checks every caller of the native core against the stub alone, so a name or parameter the
stub has and the module lacks (or the other way round) passes lint and fails at run time. Every
function, class, method and attribute of either side must be in the other, with the same
parameter names and the same parameters taking defaults (``text_signature`` of the PyO3 build).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from materializer.storage import _native

STUB = Path(_native.__file__).with_name("_native.pyi")


def _stub_parameters(function: ast.FunctionDef) -> list[tuple[str, bool]]:
    """``(name, has_default)`` of each parameter but ``self``."""
    args = function.args.args
    defaults = [False] * (len(args) - len(function.args.defaults)) + [True] * len(function.args.defaults)
    return [(arg.arg, default) for arg, default in zip(args, defaults) if arg.arg != "self"]


def _runtime_parameters(function: object) -> list[tuple[str, bool]]:
    parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    return [(p.name, p.default is not inspect.Parameter.empty) for p in parameters if p.name != "self"]


def _stub() -> tuple[dict[str, ast.FunctionDef], dict[str, ast.ClassDef]]:
    tree = ast.parse(STUB.read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    return functions, classes


def test_the_stub_names_every_function_and_class_of_the_module_and_no_other() -> None:
    functions, classes = _stub()
    public = {name for name in vars(_native) if not name.startswith("_")}
    assert set(functions) | set(classes) == public
    assert {name for name in public if isinstance(getattr(_native, name), type)} == set(classes)


def test_the_stub_functions_take_the_module_functions_parameters() -> None:
    functions, _ = _stub()
    for name, function in functions.items():
        assert _stub_parameters(function) == _runtime_parameters(getattr(_native, name)), name


def test_the_stub_classes_have_exactly_the_members_and_parameters_of_the_module_classes() -> None:
    _, classes = _stub()
    for name, node in classes.items():
        runtime = getattr(_native, name)
        methods = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
        attributes = {item.target.id for item in node.body
                      if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
        members = {member for member in vars(runtime) if not member.startswith("_") or member == "__len__"}
        assert (set(methods) - {"__init__"}) | attributes == members, name
        assert _stub_parameters(methods["__init__"]) == _runtime_parameters(runtime), name
        for method_name, method in methods.items():
            if method_name == "__init__":
                continue
            assert callable(getattr(runtime, method_name)), (name, method_name)
            assert _stub_parameters(method) == _runtime_parameters(getattr(runtime, method_name)), (name, method_name)
        for attribute in attributes:
            assert not callable(getattr(runtime, attribute)), (name, attribute)
