"""0.2's module paths of what is a folder now still import, warning with the new path (until 0.4)."""

from __future__ import annotations

import importlib
import sys

import pytest

from llama_jev._moved_modules import MOVED_MODULES


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_path_imports_the_new_module_with_a_warning(old: str, new: str) -> None:
    if new.endswith(".store"):
        pytest.importorskip("llama_index.vector_stores.postgres")
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__ is not None
    assert module.__spec__.name == new  # the new module keeps its own spec
    sys.modules.pop(old, None)


def test_the_folders_keep_their_public_names() -> None:
    from llama_jev.acl.cerbos import CerbosAcl
    from llama_jev.acl.spicedb import SpiceDBAcl
    from llama_jev.stores.postgres import AclFilters, PostgresPushdown, acl_filters, condition_filters

    assert CerbosAcl.__name__ == "CerbosAcl"
    assert SpiceDBAcl.__name__ == "SpiceDBAcl"
    assert {AclFilters.__name__, PostgresPushdown.__name__} == {"AclFilters", "PostgresPushdown"}
    assert callable(acl_filters)
    assert callable(condition_filters)
