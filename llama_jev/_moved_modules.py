"""Module paths that moved in 0.3's house, still importable until 0.4 with a ``DeprecationWarning``.

An engine or store that needs several files is one folder now (``acl/cerbos/``,
``acl/spicedb/``, ``stores/postgres/``). ``import llama_jev.stores.postgres_plan`` (0.2's path)
still works: a finder on ``sys.meta_path`` answers for the old name with the module at its new
home (the same module object, so settings changed through either name are one), and warns once
per import naming the new path. Names a user imports from a package (``llama_jev.acl.CerbosAcl``,
``llama_jev.stores.AclPGVectorStore``) did not move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

__all__ = ["MOVED_MODULES", "install"]

MOVED_MODULES = {
    "llama_jev.acl.cerbos_client": "llama_jev.acl.cerbos.client",
    "llama_jev.acl.cerbos_plan": "llama_jev.acl.cerbos.plan",
    "llama_jev.acl.cerbos_wire": "llama_jev.acl.cerbos.wire",
    "llama_jev.acl.spicedb_wire": "llama_jev.acl.spicedb.wire",
    "llama_jev.stores.postgres_plan": "llama_jev.stores.postgres.plan",
    "llama_jev.stores.postgres_sql": "llama_jev.stores.postgres.sql",
    "llama_jev.stores.postgres_store": "llama_jev.stores.postgres.store",
}
"""0.2's module path -> its home since 0.3 (CHANGELOG.md, "Moved")."""


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new} (the old path goes in 0.4)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__  # the import system sets __spec__ to the old name's: put it back
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run (the module at its new home is loaded); its own ``__spec__`` is restored."""
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``llama_jev/__init__.py`` calls it)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
