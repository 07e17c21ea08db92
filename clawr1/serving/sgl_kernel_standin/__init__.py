"""clawr1's stand-in for `sgl_kernel`, SGLang's CPU kernel package (built from SGLang's csrc/cpu; not on PyPI).

Installed as `sgl_kernel` into SGLang's own environment only (scripts/setup_sglang.sh). SGLang on a CPU without
AMX, with --attention-backend torch_native, imports a few names from this package and never calls them. Every
name here, in this module or any submodule, is a function that raises when called: a code path that does need
a kernel stops with an error naming it instead of computing something else. It registers no torch operators,
so SGLang's own check (`hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`) finds no AMX kernels.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+clawr1.standin"
STANDIN = True


class KernelMissing(NotImplementedError):
    """A kernel of SGLang's CPU kernel package was called; this stand-in has none."""


class _Missing:
    """A name of the kernel package: calling it raises; its attributes are further missing names."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise KernelMissing(f"{self._name} was called, but sgl_kernel here is clawr1's stand-in: SGLang's CPU kernels "
                            "are not on PyPI (docs/serving.md, 'SGLang on CPU'). This path needs the real package.")

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<missing kernel {self._name}>"


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any `sgl_kernel.x.y` imports as a module whose every name is missing."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _Missing(spec.name).__getattr__  # PEP 562: a missing name for every name
        return module

    def exec_module(self, module):
        pass


__getattr__ = _Missing(__name__).__getattr__
if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())
