"""A user's model named on the command line (`jaxcnn profile --fn MODULE:CALLABLE`): the callable it
names, called to build the function to profile and its example arguments.

The contract (also in `jaxcnn profile --help` and docs/architecture.md):

    MODULE:CALLABLE     an importable module (the current directory is importable) or a .py file
                        path, and a callable in it (dotted for an attribute: module:Class.build)
    CALLABLE(**kw)      returns (fn, example_args): fn the jittable function to profile, example_args
                        the tuple of its positional arguments (parameters and a batch of inputs,
                        any pytrees of arrays); kw holds batch=N and dtype=NAME when given on the
                        command line, so a callable that takes them builds that batch and dtype

    # my_models.py
    def small_cnn(batch=8, dtype="float32"):
        model = MyFlaxCNN()
        x = jnp.ones((batch, 32, 32, 3), dtype)
        params = model.init(jax.random.key(0), x)
        return model.apply, (params, x)

    jaxcnn profile --fn my_models:small_cnn --batch 64 --dtype bf16
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FACTORY_KEYWORDS = ("batch", "dtype")  # what the command line passes to the callable, when given


@dataclass(frozen=True)
class UserModel:
    name: str  # what the store calls the model: the module's last part and the callable
    spec: str  # the MODULE:CALLABLE it was built from
    fn: Callable
    example_args: tuple


def load_callable(spec: str) -> Callable:
    """The callable `spec` ('module:callable' or 'path/to/file.py:callable') names."""
    if not isinstance(spec, str):
        raise TypeError(f"fn: expected a 'MODULE:CALLABLE' string, got {type(spec).__name__}")
    where, _, attribute = spec.rpartition(":")
    if not where or not attribute:
        raise ValueError(f"fn: expected MODULE:CALLABLE (e.g. my_models:small_cnn or models.py:small_cnn), got {spec!r}")
    module = _load_module(where)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"fn: {where} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"fn: {spec} is a {type(target).__name__}, not a callable")
    return target


def _load_module(where: str):
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise ValueError(f"fn: no Python file {path}")
        name = f"jaxcnn_user_model_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        module_spec.loader.exec_module(module)
        return module
    # As `python -m` would: modules of the current directory are importable.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as err:
        if err.name is not None and where.startswith(err.name):
            raise ValueError(f"fn: no module named {where!r} (run from its directory, or give the .py file's path)") from None
        raise


def build_user_model(spec: str, *, batch: int | None = None, dtype: str | None = None) -> UserModel:
    """Calls the callable `spec` names with the given batch/dtype keywords and checks that it
    returned (fn, example_args)."""
    factory = load_callable(spec)
    given = {name: value for name, value in zip(FACTORY_KEYWORDS, (batch, dtype)) if value is not None}
    _check_keywords(spec, factory, given)
    built = factory(**given)
    if not (isinstance(built, (tuple, list)) and len(built) == 2):
        raise TypeError(f"fn: {spec} must return (fn, example_args), got {_describe(built)}")
    fn, example_args = built
    if not callable(fn):
        raise TypeError(f"fn: {spec} returned {_describe(fn)} as fn, not a callable")
    if not isinstance(example_args, (tuple, list)):
        raise TypeError(f"fn: {spec} must return example_args as a tuple of fn's positional arguments, "
                        f"got {_describe(example_args)}")
    where, _, attribute = spec.rpartition(":")
    module = Path(where).stem if where.endswith(".py") else where.rsplit(".", 1)[-1]
    return UserModel(f"{module}:{attribute}", spec, fn, tuple(example_args))


def _check_keywords(spec: str, factory: Callable, given: dict[str, Any]) -> None:
    """TypeError naming the option when the callable cannot take a keyword given for it."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: let the call say
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    for name in given:
        if name not in parameters or parameters[name].kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f"--{name}: {spec} takes no {name!r} keyword (its signature is "
                            f"{inspect.signature(factory)}); leave --{name} out or add the parameter")


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
