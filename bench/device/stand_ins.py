"""Run a script with stand-ins for packages AReaL 1.0.4 imports at module level but never calls on the
archon actor's path (a lent GPU machine has none of them and takes 64 MiB per call, too little for ray):

    python3 bench/device/stand_ins.py bench/bench_tree_gpu.py run --rows ... --shape 1.7b

Importing a stood-in package, or anything under it, gives a module whose every attribute is a placeholder
class: it can be subclassed, called, used as a decorator (it returns the function), and is falsy. Any real
use would show up as a wrong result or an AttributeError in the run, not pass silently as a number: the
bench only times the actor's forward and update.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import runpy
import sys
import types

STOOD_IN = ("ray", "wandb", "swanlab", "trackio", "tensorboardX", "datasets", "openai")


class PlaceholderType(type):
    """Placeholder classes: calling one with a function returns the function (`@ray.remote`)."""

    def __call__(cls, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], type):
            return args[0]
        return super().__call__(*args, **kwargs)

    def __getattr__(cls, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return PlaceholderType(name, (Placeholder,), {"__module__": cls.__module__})

    def __bool__(cls) -> bool:
        return False


class Placeholder(metaclass=PlaceholderType):
    """What every attribute of a stood-in module is."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __init_subclass__(cls, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # a decorator leaves the function as it is
        return Placeholder()

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder()

    def __bool__(self) -> bool:
        return False


class StoodInModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        value = PlaceholderType(name, (Placeholder,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in STOOD_IN:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StoodInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0"
        return module

    def exec_module(self, module):
        pass


def main() -> None:
    sys.meta_path.insert(0, StandInFinder())
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
